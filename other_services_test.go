package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// peer is one service with a database of its own (its own record table, so
// its own table identity), its router and its handlers, on a broker that
// the services share.
type peer struct {
	name   string
	store  *sqlstore.Store
	reg    *outbox.Registry
	router *message.Router
	pub    message.Publisher // tracked
	logger *testenv.CaptureLogger
	obs    *confirmTally
	runErr chan error

	mu   sync.Mutex
	runs map[string]map[string]int // handler -> message UUID -> runs
	// each is signalled after every run of a handler.
	each chan struct{}
}

// confirmTally counts what the observer hears, with the confirmations it
// rejected.
type confirmTally struct {
	*tally
	rejected atomic.Int64
	handled  chan struct{}
}

func (c *confirmTally) Completed(topic, consumer string) {
	c.tally.Completed(topic, consumer)
	select {
	case c.handled <- struct{}{}:
	default:
	}
}

func (c *confirmTally) ConfirmationRejected(string, string) { c.rejected.Add(1) }

func (c *confirmTally) BusinessKeyDuplicate(string, string) { c.add("business key", 1) }

func newPeer(t *testing.T, b testenv.Backend, name string, broker *gochannel.GoChannel, tracked []outbox.Tracked, cfg outbox.MiddlewareConfig) *peer {
	t.Helper()
	return newPeerWith(t, b, name, broker, tracked, cfg, nil)
}

// around puts router middlewares outside (before) and inside (after) the
// outbox middleware of a peer.
type around struct{ outer, inner []message.HandlerMiddleware }

// peerOptions are what a test may change of a peer beyond its topics and
// middleware configuration.
type peerOptions struct {
	mws    []around
	replay outbox.ReplayConfig
}

// peerOption sets one of a peer's options.
type peerOption func(*peerOptions)

// withMiddlewares puts router middlewares around the peer's outbox
// middleware.
func withMiddlewares(a around) peerOption {
	return func(o *peerOptions) { o.mws = append(o.mws, a) }
}

// withReplay gives the peer's ReplayPlugin (and its stale resubmitter) a
// configuration of the test's.
func withReplay(cfg outbox.ReplayConfig) peerOption {
	return func(o *peerOptions) { o.replay = cfg }
}

// quickConfirmations is a replay whose stale resubmitter sends a record of
// a topic with remote consumers again after 300 ms without its
// confirmations (doubling to a second), so that tests of lost copies and
// of failures reported by remote consumers take seconds.
var quickConfirmations = withReplay(outbox.ReplayConfig{Resubmit: outbox.StaleResubmitterConfig{
	OlderThan: time.Second, ConfirmWithin: 300 * time.Millisecond, Interval: 100 * time.Millisecond}})

// newPeerWith is newPeer whose tracked topics save into wrap(store) rather
// than into the store itself, when wrap is not nil, with the options.
func newPeerWith(t *testing.T, b testenv.Backend, name string, broker *gochannel.GoChannel, tracked []outbox.Tracked, cfg outbox.MiddlewareConfig,
	wrap func(*sqlstore.Store) recordstore.Store, options ...peerOption) *peer {
	t.Helper()
	var opts peerOptions
	for _, o := range options {
		o(&opts)
	}
	mws := opts.mws
	p := &peer{name: name, logger: &testenv.CaptureLogger{}, runs: map[string]map[string]int{}, each: make(chan struct{}, 1),
		obs: &confirmTally{tally: newTally(), handled: make(chan struct{}, 1)}, runErr: make(chan error, 1)}
	db := b.Open(t)
	p.store = testenv.NewStore(t, b, db, sqlstore.Mark)
	var store recordstore.Store = p.store
	if wrap != nil {
		store = wrap(p.store)
	}
	for i := range tracked {
		tracked[i].Store = store
	}
	var err error
	p.reg, err = outbox.NewRegistry(tracked...)
	require.NoError(t, err)
	p.reg.SetObserver(p.obs)
	p.router, err = message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	if cfg.Backoff == (outbox.Backoff{}) {
		cfg.Backoff = redeliverAtOnce
	}
	mw, err := outbox.NewMiddleware(p.reg, cfg, p.logger)
	require.NoError(t, err)
	for _, a := range mws {
		p.router.AddMiddleware(a.outer...)
	}
	p.router.AddMiddleware(mw)
	for _, a := range mws {
		p.router.AddMiddleware(a.inner...)
	}
	p.router.AddPlugin(outbox.ReplayPlugin(p.reg, broker, opts.replay, p.logger))
	require.NoError(t, outbox.AddConfirmationHandler(p.router, p.reg, broker, p.logger))
	p.pub, err = outbox.NewPublisher(p.reg, broker)
	require.NoError(t, err)
	return p
}

// handle adds a handler named consumer on topic that runs fn.
func (p *peer) handle(consumer, topic string, sub message.Subscriber, fn func(*message.Message) error) {
	p.router.AddNoPublisherHandler(consumer, topic, sub, func(msg *message.Message) error {
		p.mu.Lock()
		if p.runs[consumer] == nil {
			p.runs[consumer] = map[string]int{}
		}
		p.runs[consumer][msg.UUID]++
		p.mu.Unlock()
		defer func() {
			select {
			case p.each <- struct{}{}:
			default:
			}
		}()
		if fn != nil {
			return fn(msg)
		}
		return nil
	})
}

func (p *peer) start(t *testing.T) {
	t.Helper()
	go func() { p.runErr <- p.router.Run(context.Background()) }()
	select {
	case <-p.router.Running():
	case err := <-p.runErr:
		t.Fatalf("router of %s stopped before running: %v", p.name, err)
	}
	t.Cleanup(func() { _ = p.router.Close() })
}

func (p *peer) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.router.Close())
	require.NoError(t, <-p.runErr)
}

func (p *peer) ran(consumer string) map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.runs[consumer] {
		out[k] = v
	}
	return out
}

// waitRan waits until the consumer ran for each of uuids.
func (p *peer) waitRan(t *testing.T, ctx context.Context, consumer string, uuids []string) {
	t.Helper()
	for {
		got := p.ran(consumer)
		missing := 0
		for _, u := range uuids {
			if got[u] == 0 {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		select {
		case <-p.each:
		case <-ctx.Done():
			t.Fatalf("%s/%s ran for %d of %d messages", p.name, consumer, len(uuids)-missing, len(uuids))
		}
	}
}

// waitDrained waits until the topic has no pending record in the peer's
// store; each completion signals.
func (p *peer) waitDrained(t *testing.T, ctx context.Context, topic string) {
	t.Helper()
	for {
		recs, err := p.store.PendingAfter(ctx, topic, 0, 1000)
		require.NoError(t, err)
		if len(recs) == 0 {
			return
		}
		select {
		case <-p.obs.handled:
		case <-ctx.Done():
			t.Fatalf("%s: %d records of %q still pending; %s", p.name, len(recs), topic, p.pendingNow())
		}
	}
}

// waitHandled waits until the observer counted n completions: a
// completion is counted once its statement returned, a moment after the
// table shows it.
func (p *peer) waitHandled(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for p.obs.get("handled") < n {
		select {
		case <-p.obs.handled:
		case <-ctx.Done():
			t.Fatalf("%s: %d of %d completions counted; pending: %s", p.name, p.obs.get("handled"), n, p.pendingNow())
		}
	}
}

// pendingNow describes the peer's pending records and its last log lines,
// for a test that timed out waiting for them to complete.
func (p *peer) pendingNow() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	recs, err := p.store.Operator().List(ctx, sqlstore.RecordFilter{State: recordstore.Pending}, 0, 20, 0)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&b, "\n  %d %s attempts %d, resent %v, %v since sent, metadata %v: %s", r.ID, r.UUID, r.Attempts, r.Resent, r.SinceSent, r.Metadata, r.LastError)
	}
	entries := p.logger.Entries("")
	for _, e := range entries[max(0, len(entries)-15):] {
		fmt.Fprintf(&b, "\n  log %s %s %v %v", e.Level, e.Msg, e.Err, e.Fields)
	}
	return b.String()
}

func publishN(t *testing.T, pub message.Publisher, topic, prefix string, n int) []string {
	t.Helper()
	uuids := make([]string, n)
	for i := range uuids {
		uuids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		require.NoError(t, pub.Publish(topic, message.NewMessage(uuids[i], []byte(`{"n":`+fmt.Sprint(i)+`}`))))
	}
	return uuids
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestReceiversInOtherServices: service A, with a database of its own,
// publishes a tracked topic that services B and C, each with a database of
// its own, receive. A declares them as its remote consumers; they confirm
// over the broker (one GoChannel), and A's table drains.
func TestReceiversInOtherServices(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		t.Run("ConfirmationsDrainThePublishersTable", func(t *testing.T) {
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			ctx := testCtx(t)
			a := newPeer(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing", "shipping"}}}, outbox.MiddlewareConfig{})
			bb := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Confirmations: broker})
			bb.handle("billing", "orders", broker, nil)
			c := newPeer(t, b, "C", broker, nil, outbox.MiddlewareConfig{Confirmations: broker})
			c.handle("shipping", "orders", broker, nil)
			for _, p := range []*peer{a, bb, c} {
				p.start(t)
			}

			uuids := publishN(t, a.pub, "orders", "order", 10)
			bb.waitRan(t, ctx, "billing", uuids)
			c.waitRan(t, ctx, "shipping", uuids)
			a.waitDrained(t, ctx, "orders")
			a.waitHandled(t, ctx, 20)

			assert.Equal(t, 20, a.obs.get("handled"), "one completion per record and remote consumer")
			assert.Zero(t, a.obs.rejected.Load())
			assert.Empty(t, a.logger.Entries("error"))
			for _, p := range []*peer{a, bb, c} {
				p.stop(t)
			}
		})

		t.Run("WithoutConfirmationsTheTableDoesNotDrainAndTheStartSaysWhy", func(t *testing.T) {
			// Topology: A tracks a topic that no handler of its router
			// receives and that declares no receiver elsewhere.
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			a := newPeer(t, b, "A", broker, []outbox.Tracked{{Topic: "orders"}}, outbox.MiddlewareConfig{})
			a.handle("audit", "audit_log", broker, nil)
			a.start(t)
			entries := a.logger.Entries("error")
			require.Len(t, entries, 1)
			assert.Contains(t, entries[0].Err.Error(), `no handler of this router receives tracked topic "orders"`)
			assert.Contains(t, entries[0].Err.Error(), "RemoteConsumers")
			a.stop(t)
		})

		t.Run("RemoteConsumersWithoutAConfirmationHandlerAreReportedAtStart", func(t *testing.T) {
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			logger := &testenv.CaptureLogger{}
			store := testenv.NewStore(t, b, b.Open(t), sqlstore.Mark)
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, RemoteConsumers: []string{"billing"}})
			require.NoError(t, err)
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			router.AddPlugin(outbox.ReplayPlugin(reg, broker, outbox.ReplayConfig{}, logger))
			router.AddNoPublisherHandler("audit", "audit_log", broker, func(*message.Message) error { return nil })
			runErr := make(chan error, 1)
			go func() { runErr <- router.Run(context.Background()) }()
			select {
			case <-router.Running():
			case err := <-runErr:
				t.Fatalf("the router stopped before it ran: %v", err)
			}
			require.NoError(t, router.Close())
			require.NoError(t, <-runErr)
			entries := logger.Entries("error")
			require.Len(t, entries, 1)
			assert.Contains(t, entries[0].Err.Error(), "AddConfirmationHandler")
		})
	})
}

// TestCompletedOnSend: a topic for receivers that do not run the outbox
// completes its records when the wrapped publisher accepts them; a failed
// send stays pending and the next replay sends and completes it.
func TestCompletedOnSend(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		store := testenv.NewStore(t, b, b.Open(t), sqlstore.Mark)
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "events", Store: store, CompletedBy: outbox.OnSend})
		require.NoError(t, err)
		broker := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 100}, watermill.NopLogger{})
		t.Cleanup(func() { _ = broker.Close() })
		received, err := broker.Subscribe(ctx, "events")
		require.NoError(t, err)
		refusing := &switchPublisher{Publisher: broker}
		pub, err := outbox.NewPublisher(reg, refusing)
		require.NoError(t, err)

		msgs := make([]*message.Message, 5)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("event-%d", i), []byte("{}"))
		}
		require.NoError(t, pub.Publish("events", msgs...))
		pending, err := store.PendingAfter(ctx, "events", 0, 100)
		require.NoError(t, err)
		assert.Empty(t, pending, "every record complete once the send succeeded")

		refusing.refuse.Store(true)
		var sendErr *outbox.SendError
		require.ErrorAs(t, pub.Publish("events", message.NewMessage("event-lost", []byte("{}"))), &sendErr)
		pending, err = store.PendingAfter(ctx, "events", 0, 100)
		require.NoError(t, err)
		require.Len(t, pending, 1, "a failed send stays pending")

		res, err := outbox.Replay(ctx, reg, broker, outbox.ReplayConfig{}, nil)
		require.NoError(t, err)
		assert.Equal(t, 1, res.Total())
		pending, err = store.PendingAfter(ctx, "events", 0, 100)
		require.NoError(t, err)
		assert.Empty(t, pending, "the replay's send completed it")

		var got []string
		for len(got) < 6 {
			select {
			case m := <-received:
				got = append(got, m.UUID)
				m.Ack()
			case <-ctx.Done():
				t.Fatalf("received %v", got)
			}
		}
		assert.ElementsMatch(t, []string{"event-0", "event-1", "event-2", "event-3", "event-4", "event-lost"}, got)
	})
}

// TestRemoteConsumerConfig: the registry refuses remote consumer set-ups
// that cannot work.
func TestRemoteConsumerConfig(t *testing.T) {
	t.Parallel()
	store := testenv.NewStore(t, testenv.Backends()[1], testenv.SQLite(t), sqlstore.Mark)
	for name, tracked := range map[string][]outbox.Tracked{
		"NameInBothLists":       {{Topic: "orders", Store: store, Consumers: []string{"a"}, RemoteConsumers: []string{"a"}}},
		"OnSendWithConsumers":   {{Topic: "orders", Store: store, CompletedBy: outbox.OnSend, Consumers: []string{"a"}}},
		"OnSendWithRemote":      {{Topic: "orders", Store: store, CompletedBy: outbox.OnSend, RemoteConsumers: []string{"a"}}},
		"ConfirmTopicWithout":   {{Topic: "orders", Store: store, ConfirmTopic: "c"}},
		"ConfirmTopicIsTracked": {{Topic: "orders", Store: store, RemoteConsumers: []string{"a"}, ConfirmTopic: "refunds"}, {Topic: "refunds", Store: store}},
		"UnknownCompletedBy":    {{Topic: "orders", Store: store, CompletedBy: 7}},
		"EmptyRemoteConsumer":   {{Topic: "orders", Store: store, RemoteConsumers: []string{""}}},
		"RemoteConsumerTwice":   {{Topic: "orders", Store: store, RemoteConsumers: []string{"a", "a"}}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := outbox.NewRegistry(tracked...)
			assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
		})
	}
	empty, err := outbox.NewRegistry()
	require.NoError(t, err)
	_, err = outbox.NewMiddleware(empty, outbox.MiddlewareConfig{BusinessKey: func(*message.Message) string { return "" }}, nil)
	assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "a business key without an inbox")
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, Consumers: []string{"ship"}, RemoteConsumers: []string{"billing"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"billing"}, reg.RemoteConsumers("orders"))
	assert.Equal(t, []string{"ship"}, reg.Consumers("orders"))
}

// switchPublisher refuses every publish while refuse is set.
type switchPublisher struct {
	message.Publisher
	refuse atomic.Bool
}

var errRefused = errors.New("broker refuses")

func (p *switchPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.refuse.Load() {
		return errRefused
	}
	return p.Publisher.Publish(topic, msgs...)
}

// TestReceiverWithoutAConfirmationPublisherSaysSo: a receiving service whose
// middleware has no Confirmations publisher handles another service's
// message that asks for a confirmation, and says once per consumer that its
// sender will resend it until it confirms.
func TestReceiverWithoutAConfirmationPublisherSaysSo(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[1]
	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = broker.Close() })
	ctx := testCtx(t)
	a := newPeer(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}}, outbox.MiddlewareConfig{})
	r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{})
	r.handle("billing", "orders", broker, nil)
	a.start(t)
	r.start(t)
	uuids := publishN(t, a.pub, "orders", "order", 3)
	r.waitRan(t, ctx, "billing", uuids)
	entries := r.logger.Entries("error")
	require.Len(t, entries, 1, "one report for the consumer, not one per message")
	assert.Contains(t, entries[0].Msg, "MiddlewareConfig.Confirmations is not set")
	pending, err := a.store.PendingAfter(ctx, "orders", 0, 10)
	require.NoError(t, err)
	assert.Len(t, pending, 3, "nothing confirmed: the sender's records stay pending")
	a.stop(t)
	r.stop(t)
}

// TestInboxBusinessKeySkipsAnOperationUnderANewUUID: service A publishes the
// same order twice under two message UUIDs; service B's inbox, keyed by
// the order number, runs its handler for the first only, and confirms both.
func TestInboxBusinessKeySkipsAnOperationUnderANewUUID(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		t.Cleanup(func() { _ = broker.Close() })
		ctx := testCtx(t)
		db := b.Open(t)
		inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db, Table: "inbox_" + testenv.Table(t)[2:]})
		require.NoError(t, err)
		require.NoError(t, inbox.Migrate(ctx))
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE "+inbox.Table()) })

		a := newPeer(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}}, outbox.MiddlewareConfig{})
		r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Inbox: inbox, Confirmations: broker,
			BusinessKey: func(msg *message.Message) string { return msg.Metadata.Get("order") }})
		r.handle("billing", "orders", broker, nil)
		a.start(t)
		r.start(t)
		// One after the other: the first is handled, recorded and
		// confirmed (A's table drains) before the second is sent. Copies
		// handled at the same moment may both run unless the handler
		// records them with InboxTx.
		for _, u := range []string{"charge-1", "charge-1-again"} {
			msg := message.NewMessage(u, []byte("{}"))
			msg.Metadata.Set("order", "order-42")
			require.NoError(t, a.pub.Publish("orders", msg))
			a.waitDrained(t, ctx, "orders")
		}
		assert.Equal(t, map[string]int{"charge-1": 1}, r.ran("billing"), "the second operation skipped by its business key")
		assert.Equal(t, 1, r.obs.get("business key"), "counted apart")
		var skipped []testenv.LogEntry
		for _, e := range r.logger.Entries("info") {
			if e.Fields["business_key"] != nil {
				skipped = append(skipped, e)
			}
		}
		require.Len(t, skipped, 1, "logged at Info")
		assert.Equal(t, "charge-1-again", skipped[0].Fields["message_uuid"])
		assert.Equal(t, "charge-1", skipped[0].Fields["handled_message_uuid"])
		assert.Equal(t, "order-42", skipped[0].Fields["business_key"])
		a.stop(t)
		r.stop(t)
	})
}

// TestInboxRefusesAnEntryTheMessageRunsOnce: another service's message
// whose UUID is too long for an inbox key (a sender that does not use
// Watermill's UUIDs) is handled once and acked, with the reason logged,
// rather than nacked for ever.
func TestInboxRefusesAnEntryTheMessageRunsOnce(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[1]
	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = broker.Close() })
	ctx := testCtx(t)
	db := b.Open(t)
	inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db})
	require.NoError(t, err)
	require.NoError(t, inbox.Migrate(ctx))
	a := newPeer(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}}, outbox.MiddlewareConfig{})
	r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Inbox: inbox, Confirmations: broker})
	r.handle("billing", "orders", broker, nil)
	a.start(t)
	r.start(t)
	long := strings.Repeat("u", sqlstore.MaxInboxField+1)
	require.NoError(t, a.pub.Publish("orders", message.NewMessage(long, []byte("{}"))))
	a.waitDrained(t, ctx, "orders")
	assert.Equal(t, map[string]int{long: 1}, r.ran("billing"))
	errs := r.logger.Entries("error")
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0].Err, recordstore.ErrInvalidEntry)
	a.stop(t)
	r.stop(t)
}

// TestReceiverInTheDocumentedMiddlewareOrder: a receiving service with an
// inbox, Recoverer outside the outbox middleware and Retry inside it (the
// order the docs give). A handler that fails once is retried inside the
// delivery; one that panics once has its failure reported to the sender,
// which sends the message again. Either way the handler's successful run
// is recorded and confirmed once, and the sender's table drains.
func TestReceiverInTheDocumentedMiddlewareOrder(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[1]
	for name, fail := range map[string]func(){
		"FailsOnce":  func() {},
		"PanicsOnce": func() { panic("billing crashed") },
	} {
		t.Run(name, func(t *testing.T) {
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			ctx := testCtx(t)
			db := b.Open(t)
			inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db})
			require.NoError(t, err)
			require.NoError(t, inbox.Migrate(ctx))
			a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}}, outbox.MiddlewareConfig{}, nil, quickConfirmations)
			r := newPeerWith(t, b, "B", broker, nil, outbox.MiddlewareConfig{Inbox: inbox, Confirmations: broker}, nil,
				withMiddlewares(around{outer: []message.HandlerMiddleware{middleware.Recoverer},
					inner: []message.HandlerMiddleware{middleware.Retry{MaxRetries: 2}.Middleware}}))
			var runs atomic.Int32
			r.handle("billing", "orders", broker, func(*message.Message) error {
				if runs.Add(1) == 1 {
					fail()
					return errors.New("billing failed")
				}
				return nil
			})
			a.start(t)
			r.start(t)
			require.NoError(t, a.pub.Publish("orders", message.NewMessage("order-1", []byte("{}"))))
			a.waitDrained(t, ctx, "orders")
			a.waitHandled(t, ctx, 1)
			assert.Equal(t, int32(2), runs.Load(), "one failed run, one successful")
			assert.Equal(t, 1, a.obs.get("handled"), "confirmed once")
			handled, err := inbox.Handled(ctx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: "order-1"})
			require.NoError(t, err)
			assert.True(t, handled, "recorded in the inbox")
			a.stop(t)
			r.stop(t)
		})
	}
}

// TestTwoSendersShareTheConfirmationTopic: services A1 and A2, each with a
// database of its own, track a topic each with remote consumers on the
// default confirmation topic, and service B handles both. Each sender
// receives the other's confirmations too: they complete nothing there, are
// counted, and log no warning or error; both tables drain.
func TestTwoSendersShareTheConfirmationTopic(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[1]
	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = broker.Close() })
	ctx := testCtx(t)
	a1 := newPeer(t, b, "A1", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}}, outbox.MiddlewareConfig{})
	a2 := newPeer(t, b, "A2", broker, []outbox.Tracked{{Topic: "refunds", RemoteConsumers: []string{"refunding"}}}, outbox.MiddlewareConfig{})
	r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Confirmations: broker})
	r.handle("billing", "orders", broker, nil)
	r.handle("refunding", "refunds", broker, nil)
	for _, p := range []*peer{a1, a2, r} {
		p.start(t)
	}
	publishN(t, a1.pub, "orders", "order", 3)
	publishN(t, a2.pub, "refunds", "refund", 3)
	a1.waitDrained(t, ctx, "orders")
	a2.waitDrained(t, ctx, "refunds")
	a1.waitHandled(t, ctx, 3)
	a2.waitHandled(t, ctx, 3)
	for _, p := range []*peer{a1, a2, r} {
		p.stop(t)
	}
	for _, a := range []*peer{a1, a2} {
		assert.Equal(t, int64(3), a.obs.rejected.Load(), "%s counted the other's confirmations", a.name)
		assert.Empty(t, a.logger.Entries("error"), a.name)
		for _, e := range a.logger.Entries("info") {
			assert.NotContains(t, e.Msg, "WARNING", "%s: no warning (logged at Info by a logger without a warning level)", a.name)
		}
	}
}
