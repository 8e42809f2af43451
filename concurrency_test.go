package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// deliveryCounter is an outer middleware that counts deliveries the inner
// chain finished, and signals when it has seen want of them.
type deliveryCounter struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (d *deliveryCounter) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if d.n.Add(1) == d.want {
			close(d.done)
		}
		return out, err
	}
}

// runLog records every handler run with its start and end, to tell
// concurrent duplicate runs from sequential ones.
type runLog struct {
	mu   sync.Mutex
	runs map[string][][2]time.Time
	// gate holds handlers back until both instances finished their replay,
	// so that both replay the whole backlog.
	gate chan struct{}
}

func (r *runLog) handle(msg *message.Message) error {
	<-r.gate
	start := time.Now()
	time.Sleep(time.Millisecond) // a handler that takes time, so that copies can overlap
	r.mu.Lock()
	r.runs[msg.UUID] = append(r.runs[msg.UUID], [2]time.Time{start, time.Now()})
	r.mu.Unlock()
	return nil
}

// TestTwoInstancesReplayTogether starts two instances at once on one broker;
// both replay the same backlog and both receive every copy. Nothing is lost,
// copies that arrive after completion are absorbed, and the number of
// duplicate runs is reported.
func TestTwoInstancesReplayTogether(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		const backlog = 100
		crashBeforeConsumption(t, b, backlog)

		broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		defer broker.Close()
		runs := &runLog{runs: map[string][][2]time.Time{}, gate: make(chan struct{})}
		// Each record is replayed by both instances and each copy reaches
		// both subscribers.
		deliveries := &deliveryCounter{want: 4 * backlog, done: make(chan struct{})}
		routers := make([]*message.Router, 2)
		// Both instances subscribe before either replays, so that every copy
		// reaches both subscribers.
		subscribed := &sync.WaitGroup{}
		subscribed.Add(len(routers))
		for i := range routers {
			r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			r.AddMiddleware(deliveries.middleware, b.middleware(t))
			r.AddPlugin(outbox.ReplayPlugin(b.reg, broker, outbox.ReplayConfig{PageSize: 16}, nil))
			r.AddNoPublisherHandler("consume", b.topic, barrierSubscriber{broker, subscribed}, runs.handle)
			routers[i] = r
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		runErrs := make(chan error, len(routers))
		for _, r := range routers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				runErrs <- r.Run(context.Background())
			}()
		}
		close(start)
		for _, r := range routers {
			select {
			case <-r.Running():
			case err := <-runErrs:
				close(runs.gate)
				t.Fatalf("an instance stopped before it ran: %v", err)
			}
		}
		close(runs.gate)
		select {
		case <-deliveries.done:
		case <-b.ctx(t).Done():
			t.Fatalf("%d of %d deliveries finished", deliveries.n.Load(), deliveries.want)
		}
		for _, r := range routers {
			require.NoError(t, r.Close())
		}
		wg.Wait()
		close(runErrs)
		for err := range runErrs {
			require.NoError(t, err)
		}

		total, concurrent := 0, 0
		for _, id := range crashUUIDs(backlog) {
			rs := runs.runs[id]
			require.NotEmpty(t, rs, "message %s was lost", id)
			total += len(rs)
			for i := 1; i < len(rs); i++ {
				for j := 0; j < i; j++ {
					if rs[i][0].Before(rs[j][1]) && rs[j][0].Before(rs[i][1]) {
						concurrent++
						break
					}
				}
			}
		}
		absorbed := int(deliveries.want) - total
		t.Logf("%s: %d records, %d deliveries, %d handler runs, %d absorbed by the completed-check, %d duplicate runs (%d concurrent)",
			backend.Name, backlog, deliveries.want, total, absorbed, total-backlog, concurrent)
		for _, e := range b.logger.Entries("error") {
			t.Logf("logged: %s: %v %v", e.Msg, e.Err, e.Fields)
		}
		assert.Zero(t, b.pendingCount(t))

		// How many copies overlap depends on timing; a copy that arrives
		// after its record was completed is always absorbed.
		var ids []int64
		require.NoError(t, b.db.SelectContext(b.ctx(t), &ids, "SELECT id FROM "+b.store.Table()))
		require.Len(t, ids, backlog)
		late := &recordingHandler{}
		mw := b.middleware(t)(late.handle)
		for _, id := range ids {
			msg := b.ownMetadata(t, message.NewMessage(watermill.NewUUID(), nil), fmt.Sprint(id))
			_, err := mw(msg)
			require.NoError(t, err)
		}
		assert.Zero(t, late.runs.Load(), "copies arriving after completion are acked unhandled")
	})
}

// barrierSubscriber returns from Subscribe once every subscriber sharing
// its WaitGroup has subscribed.
type barrierSubscriber struct {
	message.Subscriber
	all *sync.WaitGroup
}

func (s barrierSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ch, err := s.Subscriber.Subscribe(ctx, topic)
	s.all.Done()
	s.all.Wait()
	return ch, err
}

func crashUUIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("msg-%03d", i)
	}
	return out
}

// TestManyPublishersAndConsumers runs concurrent publishers and consumers on
// one store under -race: every message is handled once and completed.
func TestManyPublishersAndConsumers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		db := backend.Open(t)
		store := testenv.NewStore(t, backend, db, sqlstore.Mark)
		const publishers, each, topics = 8, 25, 4
		tracked := make([]outbox.Tracked, topics)
		for i := range tracked {
			tracked[i] = outbox.Tracked{Topic: fmt.Sprintf("%s_%d", store.Table(), i), Store: store}
		}
		reg, err := outbox.NewRegistry(tracked...)
		require.NoError(t, err)
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
		require.NoError(t, err)

		broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		defer broker.Close()
		handled := newHandledSet(publishers * each)
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		router.AddMiddleware(mw)
		for _, tr := range tracked { // one consumer per topic, all on one store
			router.AddNoPublisherHandler("consume-"+tr.Topic, tr.Topic, broker, handled.handle)
		}
		go func() { _ = router.Run(context.Background()) }()
		<-router.Running()

		pub, err := outbox.NewPublisher(reg, broker)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for p := 0; p < publishers; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					topic := tracked[(p+i)%topics].Topic
					assert.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("p%d-%d", p, i), nil)))
				}
			}()
		}
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		select {
		case <-handled.done:
		case <-ctx.Done():
			t.Fatalf("handled %d of %d", len(handled.snapshot()), publishers*each)
		}
		require.NoError(t, router.Close())
		require.NoError(t, reg.WaitCompletions(ctx))
		for id, n := range handled.snapshot() {
			assert.Equal(t, 1, n, "message %s handled once", id)
		}
		for _, tr := range tracked {
			recs, err := store.PendingAfter(ctx, tr.Topic, 0, 1000)
			require.NoError(t, err)
			assert.Empty(t, recs, "records of %s completed", tr.Topic)
		}
	})
}
