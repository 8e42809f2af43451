package outbox_test

import (
	"context"
	"fmt"
	"slices"
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

// heldCalls holds, once armed, the calls of one method of a store (or an
// inbox) until release is closed, as a statement that takes its time
// does, and counts the calls in flight of every method it wraps.
type heldCalls struct {
	method   string
	armed    atomic.Bool
	entered  chan struct{}
	release  chan struct{}
	inFlight atomic.Int32
}

func newHeldCalls(method string, armed bool) *heldCalls {
	h := &heldCalls{method: method, entered: make(chan struct{}, 1), release: make(chan struct{})}
	h.armed.Store(armed)
	return h
}

// enter counts a call in flight, holds it if it is the held method, and
// returns the function that ends it.
func (h *heldCalls) enter(method string) func() {
	h.inFlight.Add(1)
	if slices.Contains(strings.Split(h.method, "|"), method) && h.armed.Load() {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-h.release
	}
	return func() { h.inFlight.Add(-1) }
}

// holdingStore is a real store whose background calls go through calls.
type holdingStore struct {
	*sqlstore.Store
	calls *heldCalls
}

func (s holdingStore) Complete(ctx context.Context, d recordstore.Delivery) error {
	defer s.calls.enter("Complete")()
	return s.Store.Complete(ctx, d)
}

func (s holdingStore) CompleteBatch(ctx context.Context, ds []recordstore.Delivery) []error {
	defer s.calls.enter("Complete")()
	return s.Store.CompleteBatch(ctx, ds)
}

func (s holdingStore) ClaimKey(ctx context.Context, topic, key string, afterID int64, olderThan time.Duration) ([]recordstore.Record, error) {
	defer s.calls.enter("ClaimKey")()
	return s.Store.ClaimKey(ctx, topic, key, afterID, olderThan)
}

func (s holdingStore) WaitingKeys(ctx context.Context, topic string, keys []string, olderThan time.Duration) ([]string, error) {
	defer s.calls.enter("WaitingKeys")()
	return s.Store.WaitingKeys(ctx, topic, keys, olderThan)
}

func (s holdingStore) SawConsumer(ctx context.Context, topic, consumer string) error {
	defer s.calls.enter("SawConsumer")()
	return s.Store.SawConsumer(ctx, topic, consumer)
}

func (s holdingStore) ClaimStaleBytes(ctx context.Context, topic string, afterID int64, olderThan time.Duration, limit, maxBytes int) ([]recordstore.Record, error) {
	defer s.calls.enter("ClaimStaleBytes")()
	return s.Store.ClaimStaleBytes(ctx, topic, afterID, olderThan, limit, maxBytes)
}

// holdingInbox is a real inbox whose marks go through calls.
type holdingInbox struct {
	*sqlstore.Inbox
	calls *heldCalls
}

func (in holdingInbox) MarkHandled(ctx context.Context, e recordstore.InboxEntry) error {
	defer in.calls.enter("MarkHandled")()
	return in.Inbox.MarkHandled(ctx, e)
}

// afterClose is one service of TestNothingRunsOnceWaitCompletionsReturned:
// a router on a GoChannel with the outbox's middleware and ReplayPlugin
// (which runs a stale resubmitter), one handler "ship" of the topic
// "orders", which returns, when produce is set, a message for the router
// to publish to an untracked topic, and then calls onHandled with the
// count of distinct messages it handled.
type afterClose struct {
	gc      *gochannel.GoChannel
	router  *message.Router
	runErr  chan error
	mu      sync.Mutex
	handled map[string]bool
}

func newAfterClose(t *testing.T, reg *outbox.Registry, mwCfg outbox.MiddlewareConfig, resubmit outbox.StaleResubmitterConfig, produce bool, onHandled func(n int)) *afterClose {
	t.Helper()
	s := &afterClose{handled: map[string]bool{}, runErr: make(chan error, 1)}
	s.gc = gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = s.gc.Close() })
	mw, err := outbox.NewMiddleware(reg, mwCfg, nil)
	require.NoError(t, err)
	s.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: guard}, nil)
	require.NoError(t, err)
	s.router.AddMiddleware(mw)
	running := &signalLogger{msg: "Stale resubmitter running", hit: make(chan struct{}, 1)}
	s.router.AddPlugin(outbox.ReplayPlugin(reg, s.gc, outbox.ReplayConfig{Resubmit: resubmit}, running))
	s.router.AddHandler("ship", "orders", s.gc, "shipped", s.gc, func(msg *message.Message) ([]*message.Message, error) {
		s.mu.Lock()
		s.handled[msg.UUID] = true
		n := len(s.handled)
		s.mu.Unlock()
		onHandled(n)
		if produce {
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("shipped"))}, nil
		}
		return nil, nil
	})
	go func() { s.runErr <- s.router.Run(context.Background()) }()
	select {
	case <-running.hit:
	case err := <-s.runErr:
		t.Fatalf("the router stopped before it ran: %v", err)
	}
	return s
}

// TestNothingRunsOnceWaitCompletionsReturned: one service on a GoChannel,
// a router with the outbox's middleware and ReplayPlugin (its stale
// resubmitter), one handler, on each database. Each case leaves one call
// of the outbox's, off the handler's path, held in the store while the
// router closes: Router.Close returns, WaitCompletions waits for it (with
// a context that has ended, it returns the context's error), and once it
// returned nothing of the outbox is in a store any more.
func TestNothingRunsOnceWaitCompletionsReturned(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		for _, c := range []struct {
			name string
			held string // the method held
			// burst is how many tracked messages are published; the call
			// is held once armAt were handled (0: from the start).
			burst, armAt int
			orderKey     string
			produce      bool          // the handler returns a message
			interval     time.Duration // of the stale resubmitter
			inbox        bool          // the handler receives another service's message, kept in an inbox
		}{
			// A keyed topic, a burst of records over three keys, their
			// later records held and sent again as the earlier complete:
			// the last completion's claim of the next record of its key, or
			// its read of the keys whose next record waits.
			{name: "NextRecordOfAKey", held: "ClaimKey|WaitingKeys", burst: 12, armAt: 12, orderKey: "customer"},
			// A handler that produced a message: the completion once the
			// router acked.
			{name: "CompletionOnTheRoutersAck", held: "Complete", burst: 1, produce: true},
			// The first check of the receiver: the record of the receiver
			// seen.
			{name: "ConsumerSeen", held: "SawConsumer", burst: 1},
			// The stale resubmitter's round, its claim in flight as the
			// router closes.
			{name: "StaleResubmitterRound", held: "ClaimStaleBytes", interval: time.Millisecond},
			// Another service's message, kept in the inbox, whose handler
			// produced a message: the inbox entry once the router acked.
			{name: "InboxEntryOnTheRoutersAck", held: "MarkHandled", produce: true, inbox: true},
		} {
			t.Run(c.name, func(t *testing.T) {
				b := setup(t, backend, sqlstore.Mark)
				calls := newHeldCalls(c.held, c.armAt == 0)
				tracked := outbox.Tracked{Topic: "orders", Store: holdingStore{b.store, calls}, OrderKey: c.orderKey}
				mwCfg := outbox.MiddlewareConfig{}
				if c.inbox {
					inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: backend.Dialect, DB: b.db, Table: "inbox_" + b.store.Table()[2:]})
					require.NoError(t, err)
					require.NoError(t, inbox.Migrate(b.ctx(t)))
					t.Cleanup(func() { _, _ = b.db.ExecContext(context.Background(), "DROP TABLE "+inbox.Table()) })
					mwCfg.Inbox = holdingInbox{inbox, calls}
					// The service tracks a topic of its own, which it does
					// not receive, so that its stale resubmitter runs.
					tracked.Topic = "refunds"
				}
				reg, err := outbox.NewRegistry(tracked)
				require.NoError(t, err)
				s := newAfterClose(t, reg, mwCfg, outbox.StaleResubmitterConfig{Interval: c.interval}, c.produce, func(n int) {
					if n == c.armAt {
						calls.armed.Store(true)
					}
				})
				publishKeyed(t, reg, s.gc, c.burst)
				if c.inbox {
					msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
					msg.Metadata.Set(outbox.MetadataID, "1")
					msg.Metadata.Set(outbox.MetadataTopic, "orders")
					msg.Metadata.Set(outbox.MetadataTable, "another-service")
					require.NoError(t, s.gc.Publish("orders", msg))
				}
				s.closeOnceHeld(t, calls)
				handled := c.burst
				if c.inbox {
					handled++
				}
				assert.Len(t, s.handled, handled, "messages handled")

				ended, cancel := context.WithCancel(b.ctx(t))
				cancel()
				assert.ErrorIs(t, reg.WaitCompletions(ended), context.Canceled,
					"WaitCompletions returned while a %s of the outbox's was in the store", calls.method)
				close(calls.release)
				require.NoError(t, reg.WaitCompletions(b.ctx(t)))
				assert.Zero(t, calls.inFlight.Load(), "no call of the outbox's is in the store once WaitCompletions returned")
			})
		}
	})
}

// publishKeyed publishes n tracked messages to "orders", their customer
// one of three.
func publishKeyed(t *testing.T, reg *outbox.Registry, gc *gochannel.GoChannel, n int) {
	t.Helper()
	pub, err := outbox.NewPublisher(reg, gc)
	require.NoError(t, err)
	for i := range n {
		msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
		msg.Metadata.Set("customer", fmt.Sprintf("customer-%d", i%3))
		require.NoError(t, pub.Publish("orders", msg))
	}
}

// closeOnceHeld waits until a call is held, then closes the router, which
// returns without waiting for it.
func (s *afterClose) closeOnceHeld(t *testing.T, calls *heldCalls) {
	t.Helper()
	select {
	case <-calls.entered:
	case err := <-s.runErr:
		t.Fatalf("the router stopped (%v) before a %s was held", err, calls.method)
	case <-time.After(guard):
		t.Fatalf("no %s was held", calls.method)
	}
	require.NoError(t, s.router.Close())
	require.NoError(t, <-s.runErr)
}
