package outbox_test

import (
	"context"
	"strconv"
	"strings"
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
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// gatedStore is a real store whose completions wait for gate.
type gatedStore struct {
	*sqlstore.Store
	entered chan int64
	gate    chan struct{}
}

func (g *gatedStore) Complete(ctx context.Context, d recordstore.Delivery) error {
	g.entered <- d.ID
	<-g.gate
	return g.Store.Complete(ctx, d)
}

func (g *gatedStore) CompleteBatch(ctx context.Context, ds []recordstore.Delivery) []error {
	for _, d := range ds {
		g.entered <- d.ID
		<-g.gate
	}
	return g.Store.CompleteBatch(ctx, ds)
}

// countingStore is a real store that counts its completion calls.
type countingStore struct {
	*sqlstore.Store
	mu      sync.Mutex
	alone   int
	batches [][]int64
	// deliveries are the batches' deliveries, as "id/consumer".
	deliveries [][]string
}

func (s *countingStore) Complete(ctx context.Context, d recordstore.Delivery) error {
	s.mu.Lock()
	s.alone++
	s.mu.Unlock()
	return s.Store.Complete(ctx, d)
}

func (s *countingStore) CompleteBatch(ctx context.Context, ds []recordstore.Delivery) []error {
	ids := make([]int64, len(ds))
	keys := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.ID
		keys[i] = strconv.FormatInt(d.ID, 10) + "/" + d.Consumer
	}
	s.mu.Lock()
	s.batches = append(s.batches, ids)
	s.deliveries = append(s.deliveries, keys)
	s.mu.Unlock()
	return s.Store.CompleteBatch(ctx, ds)
}

// gatedTopic is one service's tracked topic on a gatedStore: its
// publisher into GoChannel, the copies GoChannel delivers, and the
// middleware with cfg.
type gatedTopic struct {
	store *gatedStore
	reg   *outbox.Registry
	pub   message.Publisher
	sent  <-chan *message.Message
	mw    message.HandlerMiddleware
}

func newGatedTopic(t *testing.T, b *bundle, orderKey string, cfg outbox.MiddlewareConfig) gatedTopic {
	t.Helper()
	g := gatedTopic{store: &gatedStore{Store: b.store, entered: make(chan int64, 8), gate: make(chan struct{})}}
	var err error
	g.reg, err = outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: g.store, OrderKey: orderKey})
	require.NoError(t, err)
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 8}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	g.sent, err = gc.Subscribe(b.ctx(t), b.topic)
	require.NoError(t, err)
	g.pub, err = outbox.NewPublisher(g.reg, gc)
	require.NoError(t, err)
	g.mw, err = outbox.NewMiddleware(g.reg, cfg, b.logger)
	require.NoError(t, err)
	return g
}

// TestCompleteInBackground, one handler of one topic: by default a message
// goes as soon as its handler succeeded, while its completion waits;
// WaitCompletions waits for the completions, and then no record is
// pending. With Complete.BeforeAck the middleware returns only once the
// completion is done. TestOrderedFirstCopyWaitsForTheEarlierCompletion
// has a topic with an order key.
func TestCompleteInBackground(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		for _, c := range []struct {
			name       string
			background bool
			returns    bool // before the completion ran
		}{
			{"InBackgroundByDefault", true, true},
			{"OnTheHandlersPathWithCompleteBeforeAck", false, false},
		} {
			t.Run(c.name, func(t *testing.T) {
				b := setup(t, backend, sqlstore.Mark)
				g := newGatedTopic(t, b, "", outbox.MiddlewareConfig{Complete: outbox.CompleteConfig{BeforeAck: !c.background}})
				store, reg, ctx := g.store, g.reg, b.ctx(t)
				handled := 0
				h := g.mw(func(*message.Message) ([]*message.Message, error) { handled++; return nil, nil })

				const n = 3
				for i := 0; i < n; i++ {
					msg := message.NewMessage(watermill.NewUUID(), []byte("payload"))
					require.NoError(t, g.pub.Publish(b.topic, msg))
					got := <-g.sent
					got.Ack()
					copy := got.Copy()
					copy.SetContext(context.Background())
					done := make(chan error, 1)
					go func() { _, err := h(copy); done <- err }()
					if c.returns {
						select {
						case err := <-done:
							require.NoError(t, err)
						case <-time.After(guard):
							t.Fatal("the middleware did not return while the completion waited")
						}
						<-store.entered
						continue
					}
					<-store.entered
					select {
					case <-done:
						t.Fatal("the middleware returned before the completion ran")
					default:
					}
					store.gate <- struct{}{}
					require.NoError(t, <-done)
				}
				assert.Equal(t, n, handled)
				if c.returns {
					assert.Equal(t, n, b.pendingCount(t), "the completions still wait")
					cancelled, cancel := context.WithCancel(ctx)
					cancel()
					assert.ErrorIs(t, reg.WaitCompletions(cancelled), context.Canceled, "completions still run")
					close(store.gate)
				}
				require.NoError(t, reg.WaitCompletions(ctx))
				assert.Zero(t, b.pendingCount(t), "every completion is done once WaitCompletions returns")
			})
		}
	})
}

// TestTheCompletionsOfOneWindowGoAsOneCall: one handler of one topic, the
// defaults but for a batch window long enough for the test's handlings.
// The completions that follow eight acknowledgements within one window go
// to the store as one CompleteBatch call, rather than eight Complete
// calls (of which the first would run alone), and complete every record.
// Every database.
func TestTheCompletionsOfOneWindowGoAsOneCall(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		for _, mode := range []sqlstore.Completion{sqlstore.Delete, sqlstore.Mark} {
			t.Run(mode.String(), func(t *testing.T) {
				b := setup(t, backend, mode)
				store := &countingStore{Store: b.store}
				reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store})
				require.NoError(t, err)
				b.reg = reg
				msgs := b.publishTracked(t, 8)
				mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Complete: outbox.CompleteConfig{BatchWait: 2 * time.Second}}, b.logger)
				require.NoError(t, err)
				h := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
				var ids []int64
				for _, msg := range msgs {
					id, err := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataID), 10, 64)
					require.NoError(t, err)
					ids = append(ids, id)
					_, err = h(msg)
					require.NoError(t, err)
				}
				require.NoError(t, reg.WaitCompletions(b.ctx(t)))
				assert.Zero(t, b.pendingCount(t), "every record is complete")
				store.mu.Lock()
				defer store.mu.Unlock()
				assert.Zero(t, store.alone, "no completion went alone")
				require.Len(t, store.batches, 1, "one call for the window")
				assert.ElementsMatch(t, ids, store.batches[0])
			})
		}
	})
}

// TestTwoConsumersCompleteThroughOneWindow: one service, two handlers on
// one topic (declared consumers billing and shipping) behind a router on
// GoChannel, completions in the background with a window long enough to
// gather both handlers' completions of every message. Each consumer's
// delivery of each record reaches the store in the one CompleteBatch call,
// and every record is complete. Every database, both modes.
func TestTwoConsumersCompleteThroughOneWindow(t *testing.T) {
	t.Parallel()
	consumers := []string{"billing", "shipping"}
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		for _, mode := range []sqlstore.Completion{sqlstore.Delete, sqlstore.Mark} {
			t.Run(mode.String(), func(t *testing.T) {
				b := setup(t, backend, mode)
				store := &countingStore{Store: b.store}
				reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store, Consumers: consumers})
				require.NoError(t, err)
				b.reg = reg
				mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Complete: outbox.CompleteConfig{BatchWait: 3 * time.Second}}, b.logger)
				require.NoError(t, err)
				gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
				t.Cleanup(func() { _ = gc.Close() })
				ctx := b.ctx(t)
				ran := routeConsumers(t, ctx, mw, gc, b.topic, consumers, 16)

				pub, err := outbox.NewPublisher(reg, gc)
				require.NoError(t, err)
				const n = 8
				for range n {
					require.NoError(t, pub.Publish(b.topic, message.NewMessage(watermill.NewUUID(), []byte("{}"))))
				}
				runs := map[string]int{}
				for range 2 * n {
					select {
					case c := <-ran:
						runs[c]++
					case <-ctx.Done():
						t.Fatalf("the handlers ran %v of %d messages each", runs, n)
					}
				}
				assert.Equal(t, map[string]int{"billing": n, "shipping": n}, runs)
				require.NoError(t, reg.WaitCompletions(ctx))
				assert.Zero(t, b.pendingCount(t), "every record is complete")

				store.mu.Lock()
				defer store.mu.Unlock()
				assert.Zero(t, store.alone, "no completion went alone")
				require.Len(t, store.deliveries, 1, "one call for the window")
				byID := map[int64][]string{}
				for _, d := range store.deliveries[0] {
					id, consumer, _ := strings.Cut(d, "/")
					n, err := strconv.ParseInt(id, 10, 64)
					require.NoError(t, err)
					byID[n] = append(byID[n], consumer)
				}
				assert.Len(t, byID, n, "every record")
				for id, cs := range byID {
					assert.ElementsMatch(t, consumers, cs, "record %d: each consumer's delivery once", id)
				}
			})
		}
	})
}

// TestCopyDuringTheBackgroundCompletionIsSkipped: one handler of one
// topic, the defaults. A second copy of a message (a replay's, say) that
// arrives while the first copy's completion still runs in the background
// waits for that completion, then finds the record completed and is acked
// without running the handler. Every database.
func TestCopyDuringTheBackgroundCompletionIsSkipped(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		store := &gatedStore{Store: b.store, entered: make(chan int64, 2), gate: make(chan struct{})}
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store})
		require.NoError(t, err)
		b.reg = reg
		msgs := b.publishTracked(t, 1)
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, b.logger)
		require.NoError(t, err)
		var runs atomic.Int32
		h := mw(func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil })

		_, err = h(msgs[0].Copy())
		require.NoError(t, err)
		<-store.entered // the completion runs, and waits at the gate
		second := make(chan error, 1)
		go func() { _, err := h(msgs[0].Copy()); second <- err }()
		select {
		case err := <-second:
			t.Fatalf("the second copy went through while the completion ran (err %v, runs %d)", err, runs.Load())
		case <-time.After(100 * time.Millisecond):
		}
		close(store.gate)
		require.NoError(t, <-second)
		assert.EqualValues(t, 1, runs.Load(), "the second copy did not run the handler")
		require.NoError(t, reg.WaitCompletions(b.ctx(t)))
		assert.Zero(t, b.pendingCount(t))
	})
}

// TestRouterCloseWaitsForTheCompletionsInTheBackground: one service, one
// handler on GoChannel, the defaults (completions in the background), and
// no call to WaitCompletions: the router's Close returns only once the
// completion of the last message handled has run, so that a clean stop
// leaves nothing pending to be handled again at the next start. Every
// database.
func TestRouterCloseWaitsForTheCompletionsInTheBackground(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		store := &gatedStore{Store: b.store, entered: make(chan int64, 8), gate: make(chan struct{})}
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store})
		require.NoError(t, err)
		gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		t.Cleanup(func() { _ = gc.Close() })
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, b.logger)
		require.NoError(t, err)
		router.AddMiddleware(mw)
		router.AddPlugin(outbox.ReplayPlugin(reg, gc, outbox.ReplayConfig{}, b.logger))
		handled := make(chan struct{}, 1)
		router.AddNoPublisherHandler("ship", b.topic, gc, func(*message.Message) error {
			handled <- struct{}{}
			return nil
		})
		runErr := make(chan error, 1)
		go func() { runErr <- router.Run(context.Background()) }()
		<-router.Running()
		pub, err := outbox.NewPublisher(reg, gc)
		require.NoError(t, err)
		require.NoError(t, pub.Publish(b.topic, message.NewMessage(watermill.NewUUID(), []byte("x"))))
		<-handled
		<-store.entered // the completion runs, in the background, and waits

		closed := make(chan error, 1)
		go func() { closed <- router.Close() }()
		// Nothing tells that Close waits; it must not return while the
		// completion does.
		select {
		case err := <-closed:
			t.Fatalf("the router closed before the completion ran (Close: %v)", err)
		case <-time.After(200 * time.Millisecond):
		}
		close(store.gate)
		require.NoError(t, <-closed)
		require.NoError(t, <-runErr)
		assert.Zero(t, b.pendingCount(t), "the record was complete once Close returned")
	})
}

// TestOrderedFirstCopyWaitsForTheEarlierCompletion, one handler of one
// topic with an order key: the first copy of a key's first record runs
// unchecked and completes in the background; the first copy of the next
// record, which waits for it, runs only once that completion committed,
// so that a crash in between cannot make the first record run again
// after the second.
func TestOrderedFirstCopyWaitsForTheEarlierCompletion(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Delete)
		g := newGatedTopic(t, b, "order", outbox.MiddlewareConfig{})
		store, reg, sent, pub, mw, ctx := g.store, g.reg, g.sent, g.pub, g.mw, b.ctx(t)
		var mu sync.Mutex
		var ran []string
		h := mw(func(msg *message.Message) ([]*message.Message, error) {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, string(msg.Payload))
			return nil, nil
		})
		deliver := func() <-chan error {
			got := <-sent
			got.Ack()
			copy := got.Copy()
			copy.SetContext(context.Background())
			done := make(chan error, 1)
			go func() { _, err := h(copy); done <- err }()
			return done
		}
		for _, p := range []string{"1", "2"} {
			msg := message.NewMessage(watermill.NewUUID(), []byte(p))
			msg.Metadata.Set("order", "k")
			require.NoError(t, pub.Publish(b.topic, msg))
		}

		require.NoError(t, <-deliver(), "record 1 returns while its completion waits")
		<-store.entered
		second := deliver()
		select {
		case err := <-second:
			t.Fatalf("record 2 returned (%v) before record 1's completion committed", err)
		default:
		}
		close(store.gate)
		require.NoError(t, <-second)
		mu.Lock()
		assert.Equal(t, []string{"1", "2"}, ran)
		mu.Unlock()
		require.NoError(t, reg.WaitCompletions(ctx))
		assert.Zero(t, b.pendingCount(t))
	})
}

// routeConsumers runs a router with mw and one handler per consumer on
// topic of sub until the test ends; each handler sends its consumer's
// name to the channel returned (buffered to size) for each message it
// handles.
func routeConsumers(t *testing.T, ctx context.Context, mw message.HandlerMiddleware, sub message.Subscriber, topic string, consumers []string, size int) <-chan string {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(mw)
	ran := make(chan string, size)
	for _, consumer := range consumers {
		router.AddNoPublisherHandler(consumer, topic, sub, func(*message.Message) error {
			ran <- consumer
			return nil
		})
	}
	go func() { _ = router.Run(ctx) }()
	t.Cleanup(func() { _ = router.Close() })
	<-router.Running()
	return ran
}
