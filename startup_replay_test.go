package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// handledSet records which message UUIDs a handler ran for, and signals once
// it has seen want distinct ones.
type handledSet struct {
	mu    sync.Mutex
	count map[string]int
	want  int
	done  chan struct{}
}

func newHandledSet(want int) *handledSet {
	return &handledSet{count: map[string]int{}, want: want, done: make(chan struct{})}
}

func (s *handledSet) handle(msg *message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count[msg.UUID]++
	if len(s.count) == s.want && s.count[msg.UUID] == 1 {
		close(s.done)
	}
	return nil
}

func (s *handledSet) snapshot() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.count))
	for k, v := range s.count {
		out[k] = v
	}
	return out
}

// crashBeforeConsumption publishes n tracked messages into a GoChannel that
// nobody subscribes to, which is what a crash between send and consumption
// leaves behind: records, and no messages anywhere.
func crashBeforeConsumption(t *testing.T, b *bundle, n int) []string {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	pub, err := outbox.NewPublisher(b.reg, gc)
	require.NoError(t, err)
	uuids := make([]string, n)
	for i := range uuids {
		uuids[i] = fmt.Sprintf("msg-%03d", i)
		require.NoError(t, pub.Publish(b.topic, message.NewMessage(uuids[i], []byte(uuids[i]))))
	}
	require.NoError(t, gc.Close())
	return uuids
}

// restartedService is a fresh router on a fresh, non-persistent GoChannel,
// with the middleware and the replay plugin, as a restarted process has.
func restartedService(t *testing.T, b *bundle, handled *handledSet, pub message.Publisher, cfg outbox.ReplayConfig) (*message.Router, *gochannel.GoChannel) {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	if pub == nil {
		pub = gc
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(b.middleware(t))
	router.AddPlugin(outbox.ReplayPlugin(b.reg, pub, cfg, b.logger))
	router.AddNoPublisherHandler("consume", b.topic, gc, handled.handle)
	return router, gc
}

// runUntilHandled runs the router until the handled set is complete, then
// closes it; it fails the test if the router stops or the set stays short.
func runUntilHandled(t *testing.T, b *bundle, router *message.Router, handled *handledSet) {
	t.Helper()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	select {
	case <-handled.done:
	case err := <-runErr:
		t.Fatalf("router stopped: %v", err)
	case <-b.ctx(t).Done():
		t.Fatalf("handled %d of %d messages", len(handled.snapshot()), handled.want)
	}
	require.NoError(t, router.Close())
	require.NoError(t, <-runErr)
}

func TestReplay(t *testing.T) {
	t.Parallel()

	t.Run("AfterCrashDeliversEachPendingRecordOnce", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			uuids := crashBeforeConsumption(t, b, 23)
			require.Equal(t, 23, b.pendingCount(t))

			handled := newHandledSet(len(uuids))
			router, _ := restartedService(t, b, handled, nil, outbox.ReplayConfig{PageSize: 5})
			runUntilHandled(t, b, router, handled)

			got := handled.snapshot()
			for _, u := range uuids {
				assert.Equal(t, 1, got[u], "message %s handled exactly once", u)
			}
			assert.Zero(t, b.pendingCount(t), "every replayed record was completed")

			var logged bool
			for _, e := range b.logger.Entries("info") {
				if e.Msg == "Replayed pending records" && e.Fields["replayed"] == 23 {
					logged = true
				}
			}
			assert.True(t, logged, "replay logs how many records it sent per name")
		})
	})

	t.Run("SendFailureIsDeliveredByNextReplay", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			broken := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			require.NoError(t, broken.Close())
			pub, err := outbox.NewPublisher(b.reg, broken)
			require.NoError(t, err)
			var sendErr *outbox.SendError
			require.ErrorAs(t, pub.Publish(b.topic, message.NewMessage("late", []byte("x"))), &sendErr)

			handled := newHandledSet(1)
			router, _ := restartedService(t, b, handled, nil, outbox.ReplayConfig{})
			runUntilHandled(t, b, router, handled)
			assert.Equal(t, map[string]int{"late": 1}, handled.snapshot())
			assert.Zero(t, b.pendingCount(t))
		})
	})

	t.Run("ReadFailureAbortsRun", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, 3)
			b.store.Attach(closedDB(t, backend))
			// A store that cannot verify itself, so that the replay gets as
			// far as reading the records.
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: plainStore{b.store}})
			require.NoError(t, err)
			b.reg = reg

			router, _ := restartedService(t, b, newHandledSet(3), nil, outbox.ReplayConfig{})
			err = router.Run(context.Background())
			var replayErr *outbox.ResendError
			require.ErrorAs(t, err, &replayErr, "the router does not start")
			assert.Equal(t, b.topic, replayErr.Topic)
		})
	})

	t.Run("SendFailureAbortsRunNamingTheRecord", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, 3)
			recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, 10)
			require.NoError(t, err)

			broken := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			require.NoError(t, broken.Close())
			router, _ := restartedService(t, b, newHandledSet(3), broken, outbox.ReplayConfig{})
			err = router.Run(context.Background())
			var replayErr *outbox.ResendError
			require.ErrorAs(t, err, &replayErr)
			assert.Equal(t, recs[0].ID, replayErr.ID)
			assert.Contains(t, err.Error(), fmt.Sprintf("record %d", recs[0].ID))
			assert.Equal(t, 3, b.pendingCount(t), "nothing is lost: the records stay pending")
		})
	})

	t.Run("FunctionReturnsCountsPerName", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, 7)
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			defer gc.Close()
			sent := &recordingPublisher{Publisher: gc}

			res, err := outbox.Replay(b.ctx(t), b.reg, sent, outbox.ReplayConfig{PageSize: 2}, nil)
			require.NoError(t, err)
			assert.Equal(t, outbox.ResendResult{b.topic: 7}, res)
			assert.Equal(t, []int{2, 2, 2, 1}, sent.batches, "one Publish per page")
			require.Len(t, sent.msgs, 7)
			var prev int64
			for _, m := range sent.msgs {
				id := idOf(t, m)
				assert.Greater(t, id, prev, "replay sends in id order")
				prev = id
				assert.Equal(t, m.UUID, string(m.Payload), "original UUID and payload")
				assert.Equal(t, b.topic, m.Metadata.Get(outbox.MetadataTopic))
			}
		})
	})

	t.Run("DecoratedPublisherIsUnwrappedAndSavesNothingTwice", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, 3)
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			defer gc.Close()
			pub, err := outbox.NewPublisher(b.reg, gc)
			require.NoError(t, err)
			res, err := outbox.Replay(b.ctx(t), b.reg, pub, outbox.ReplayConfig{}, nil)
			require.NoError(t, err)
			assert.Equal(t, 3, res.Total())
			assert.Equal(t, 3, b.rowCount(t), "replay through the decorated publisher saves no second record")
		})
	})

	t.Run("WrappedDecoratedPublisherIsUnwrappedDownToTheDecorator", func(t *testing.T) {
		t.Parallel()
		b := setup(t, sqliteBackend(t), sqlstore.Mark)
		crashBeforeConsumption(t, b, 3)
		gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		defer gc.Close()
		inner := &countingPublisher{Publisher: gc}
		decorated, err := outbox.NewPublisher(b.reg, wrappingPublisher{inner})
		require.NoError(t, err)
		res, err := outbox.Replay(b.ctx(t), b.reg, wrappingPublisher{decorated}, outbox.ReplayConfig{}, nil)
		require.NoError(t, err)
		assert.Equal(t, 3, res.Total())
		assert.Equal(t, 3, b.rowCount(t), "replay through a wrapper of the decorated publisher saves no second record")
		_, sent := inner.counts()
		assert.Equal(t, 3, sent, "and sends through what lies under the decorator")
	})
}

// TestHandlerPublishesTrackedOnOneConnection runs the whole flow with a pool
// of exactly one connection: the middleware must give its connection back
// before the handler inserts its own record.
func TestHandlerPublishesTrackedOnOneConnection(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		db := backend.Open(t)
		db.SetMaxOpenConns(1)
		inStore := testenv.NewStore(t, backend, db, sqlstore.Mark)
		outStore := testenv.NewStore(t, backend, db, sqlstore.Mark)
		reg, err := outbox.NewRegistry(
			outbox.Tracked{Topic: "in", Store: inStore},
			outbox.Tracked{Topic: "out", Store: outStore},
		)
		require.NoError(t, err)
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
		require.NoError(t, err)

		gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		defer gc.Close()
		pub, err := outbox.NewPublisher(reg, gc)
		require.NoError(t, err)
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		router.AddMiddleware(mw)
		router.AddPublisherDecorators(outbox.PublisherDecorator(reg))
		// Handler one publishes inside the handler and returns a produced message.
		router.AddHandler("forward", "in", gc, "out", gc, func(msg *message.Message) ([]*message.Message, error) {
			if err := pub.Publish("out", message.NewMessage(msg.UUID+"-direct", nil)); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage(msg.UUID+"-produced", nil)}, nil
		})
		handled := newHandledSet(2)
		router.AddNoPublisherHandler("sink", "out", gc, handled.handle)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = router.Run(ctx) }()
		<-router.Running()

		require.NoError(t, pub.Publish("in", message.NewMessage("m1", nil)))
		select {
		case <-handled.done:
		case <-func() <-chan struct{} { c, cl := context.WithTimeout(ctx, 30*e9); _ = cl; return c.Done() }():
			t.Fatal("deadlock: the flow did not finish on a one-connection pool")
		}
		require.NoError(t, router.Close())
		assert.Equal(t, map[string]int{"m1-direct": 1, "m1-produced": 1}, handled.snapshot())

		check := func(s *sqlstore.Store, topic string) int {
			recs, err := s.PendingAfter(context.Background(), topic, 0, 100)
			require.NoError(t, err)
			return len(recs)
		}
		require.Eventually(t, func() bool { return check(inStore, "in") == 0 && check(outStore, "out") == 0 }, 30*e9, 5*e6,
			"every record of the chain is completed")
	})
}

// recordingPublisher keeps what passes through it to the real publisher.
type recordingPublisher struct {
	message.Publisher
	batches []int
	msgs    []*message.Message
}

func (r *recordingPublisher) Publish(topic string, msgs ...*message.Message) error {
	r.batches = append(r.batches, len(msgs))
	r.msgs = append(r.msgs, msgs...)
	return r.Publisher.Publish(topic, msgs...)
}

const (
	e6 = 1_000_000
	e9 = 1_000_000_000
)

// TestReplayAfterRunning replays in the background once the router runs,
// which a publisher that blocks until the message is handled needs.
func TestReplayAfterRunning(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		uuids := crashBeforeConsumption(t, b, 4)

		blocking := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
		defer blocking.Close()
		handled := newHandledSet(len(uuids))
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		router.AddMiddleware(b.middleware(t))
		router.AddPlugin(outbox.ReplayPlugin(b.reg, blocking, outbox.ReplayConfig{AfterRunning: true}, nil))
		router.AddNoPublisherHandler("consume", b.topic, blocking, handled.handle)
		runUntilHandled(t, b, router, handled)
		assert.Zero(t, b.pendingCount(t))
	})

	t.Run("FailureClosesRouterAndReports", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, 2)
			broken := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			require.NoError(t, broken.Close())
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			defer gc.Close()

			reported := make(chan error, 1)
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			router.AddMiddleware(b.middleware(t))
			router.AddPlugin(outbox.ReplayPlugin(b.reg, broken, outbox.ReplayConfig{AfterRunning: true, OnError: func(err error) { reported <- err }}, nil))
			router.AddNoPublisherHandler("consume", b.topic, gc, newHandledSet(2).handle)
			require.NoError(t, router.Run(b.ctx(t)), "Run returns once the failed replay closed the router")
			var replayErr *outbox.ResendError
			require.ErrorAs(t, <-reported, &replayErr)
			assert.True(t, router.IsClosed())
			assert.Equal(t, 2, b.pendingCount(t))
		})
	})
}

// wrappingPublisher is a user's decorator that says what it wraps.
type wrappingPublisher struct{ message.Publisher }

func (w wrappingPublisher) Unwrap() message.Publisher { return w.Publisher }
