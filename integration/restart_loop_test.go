package integration_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// A service in a crash loop: it starts on a backlog, replays with the
// README's defaults (outbox.ReplayConfig{}), and dies before handling
// anything, restarts times.
const (
	restartLoopBacklog  = 2011
	restartLoopRestarts = 15
)

// Topology: one service, PostgreSQL, a durable RabbitMQ queue that keeps
// what it was sent across the service's restarts. The defaults replay by
// claims: the first start sends the records never resent since their
// publish once, and the later starts, within the resubmitter's OlderThan,
// send nothing; the queue gets at most two copies of each record (one
// duplicate per OlderThan window), not one per restart.
func TestRestartLoopOnRabbitMQSendsAboutOneCopyPerWindow(t *testing.T) {
	t.Parallel()
	uri := amqpURI()
	admin, err := amqp091.Dial(uri)
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	store := newRestartLoopStore(t)
	topic := "restart_loop_" + watermill.NewShortUUID()
	config := crashAMQPConfig("ship")
	t.Cleanup(func() { deleteQueue(t, admin, config, topic) })
	connect := func(t *testing.T) (message.Publisher, message.Subscriber, func()) {
		pub, err := amqp.NewPublisher(config, watermill.NopLogger{})
		require.NoError(t, err)
		sub, err := amqp.NewSubscriber(config, watermill.NopLogger{})
		require.NoError(t, err)
		return pub, sub, func() {
			_ = sub.Close()
			_ = pub.Close()
		}
	}

	// The backlog is sent once, to the bound queue, by a service that
	// dies before handling it.
	pub, sub, closeBroker := connect(t)
	svc := startRestartLoopService(t, store, topic, pub, neverHandles{sub}, nil)
	require.NoError(t, svc.publisher.Publish(topic, backlog(restartLoopBacklog)...))
	svc.stop(t)
	closeBroker()

	started := time.Now()
	for range restartLoopRestarts {
		pub, sub, closeBroker := connect(t)
		startRestartLoopService(t, store, topic, pub, neverHandles{sub}, nil).stop(t)
		closeBroker()
	}
	elapsed := time.Since(started)

	copies := drainQueue(t, admin, config.Queue.GenerateName(topic))
	require.Len(t, copies, restartLoopBacklog, "every record is in the queue")
	total, most := 0, 0
	for _, n := range copies {
		total += n
		most = max(most, n)
	}
	t.Logf("RabbitMQ: %d restarts in %v on a backlog of %d: the queue got %d copies (%d duplicates), at most %d of a record",
		restartLoopRestarts, elapsed.Round(time.Millisecond), restartLoopBacklog, total, total-restartLoopBacklog, most)
	require.Less(t, elapsed, 5*time.Minute, "the loop ran within one OlderThan window (5 minutes by default)")
	assert.LessOrEqual(t, most, 2, "within one OlderThan window a record has its publish's copy and at most one resend")
}

// Topology: one service, PostgreSQL, a GoChannel, which loses what it
// holds at each crash. The defaults replay every pending record at every
// start there, so the start that lives handles the whole backlog.
func TestRestartLoopOnGoChannelLosesNothing(t *testing.T) {
	t.Parallel()
	store := newRestartLoopStore(t)
	const topic = "orders"
	pubSub := func() *gochannel.GoChannel { return gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}) }

	gc := pubSub()
	svc := startRestartLoopService(t, store, topic, gc, neverHandles{gc}, nil)
	require.NoError(t, svc.publisher.Publish(topic, backlog(restartLoopBacklog)...))
	svc.stop(t)
	_ = gc.Close()
	for range restartLoopRestarts - 1 {
		gc := pubSub()
		startRestartLoopService(t, store, topic, gc, neverHandles{gc}, nil).stop(t)
		_ = gc.Close()
	}

	// The last start lives and handles.
	var mu sync.Mutex
	handled := map[string]int{}
	all := make(chan struct{})
	gc = pubSub()
	t.Cleanup(func() { _ = gc.Close() })
	svc = startRestartLoopService(t, store, topic, gc, gc, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled[string(msg.Payload)]++
		if len(handled) == restartLoopBacklog {
			close(all)
		}
		return nil
	})
	select {
	case <-all:
	case <-time.After(time.Minute):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the last start handled %d of %d records", len(handled), restartLoopBacklog)
	}
	svc.stop(t)
	for payload, n := range handled {
		require.Equal(t, 1, n, "record %s handled once", payload)
	}
	pending, err := store.Operator().List(context.Background(), sqlstore.RecordFilter{}, 0, 10, 0)
	require.NoError(t, err)
	assert.Empty(t, pending, "every record is complete")
	t.Logf("GoChannel: %d starts on a backlog of %d lost nothing: the last handled every record once", restartLoopRestarts, restartLoopBacklog)
}

func newRestartLoopStore(t *testing.T) *sqlstore.Store {
	backend := records(t, "Postgres")
	return testenv.NewStore(t, backend, backend.Open(t), sqlstore.Mark)
}

func backlog(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("order-%d", i)))
	}
	return msgs
}

// restartLoopService is one start of the service, wired as the README's
// adoption wires it.
type restartLoopService struct {
	router    *message.Router
	publisher message.Publisher
	cancel    context.CancelFunc
	stopped   chan struct{}
}

// startRestartLoopService starts the service and returns once its router
// runs, the startup replay done; handle nil handles nothing.
func startRestartLoopService(t *testing.T, store *sqlstore.Store, topic string, pub message.Publisher, sub message.Subscriber, handle message.NoPublishHandlerFunc) *restartLoopService {
	t.Helper()
	logger := watermill.NopLogger{}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store})
	require.NoError(t, err)
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, logger)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)
	if handle == nil {
		handle = func(*message.Message) error { return nil }
	}
	router.AddNoPublisherHandler("ship", topic, sub, handle)
	router.AddMiddleware(mw)
	router.AddPublisherDecorators(outbox.PublisherDecorator(reg))
	router.AddPlugin(outbox.ReplayPlugin(reg, pub, outbox.ReplayConfig{}, logger))
	decorated, err := outbox.NewPublisher(reg, pub)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	s := &restartLoopService{router: router, publisher: decorated, cancel: cancel, stopped: make(chan struct{})}
	runErr := make(chan error, 1)
	go func() {
		defer close(s.stopped)
		runErr <- router.Run(ctx)
	}()
	select {
	case <-router.Running():
	case err := <-runErr:
		t.Fatalf("the service did not start: %v", err)
	}
	return s
}

func (s *restartLoopService) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	<-s.stopped
}

// neverHandles subscribes (the queue is bound, the subscription open) and
// delivers nothing to the handler: a service that dies before handling.
type neverHandles struct{ message.Subscriber }

func (s neverHandles) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if _, err := s.Subscriber.Subscribe(ctx, topic); err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		<-ctx.Done()
		close(out)
	}()
	return out, nil
}

// drainQueue takes every message of the queue and counts the copies of
// each record.
func drainQueue(t *testing.T, admin *amqp091.Connection, queue string) map[int64]int {
	t.Helper()
	ch, err := admin.Channel()
	require.NoError(t, err)
	defer ch.Close()
	copies := map[int64]int{}
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return copies
		}
		raw, _ := d.Headers[outbox.MetadataID].(string)
		id, err := strconv.ParseInt(raw, 10, 64)
		require.NoError(t, err, "a copy without a record id: %v", d.Headers)
		copies[id]++
	}
}

func deleteQueue(t *testing.T, admin *amqp091.Connection, config amqp.Config, topic string) {
	ch, err := admin.Channel()
	if err != nil {
		t.Logf("amqp channel: %v", err)
		return
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(config.Queue.GenerateName(topic), false, false, false); err != nil {
		t.Logf("delete queue: %v", err)
	}
	if err := ch.ExchangeDelete(config.Exchange.GenerateName(topic), false, false); err != nil {
		t.Logf("delete exchange: %v", err)
	}
}
