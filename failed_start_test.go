package outbox_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestFailedStartsLeakNoGoroutine starts, nine times, a router on
// GoChannel, on SQLite, with ReplayPlugin, the stale resubmitter's and the
// cleaner's plugins, whose start fails, and closes the GoChannel after each
// failed Run as a service does: the goroutines that the outbox started end.
// Watermill 1.5.1's router leaves one goroutine of its own behind per Run
// that fails after its first subscription (watchAllHandlersStopped waits for
// a handler that never started); the test counts those apart and checks
// there is no more than one per start. It is not parallel: the count is the
// process's.
func TestFailedStartsLeakNoGoroutine(t *testing.T) {
	const tries = 9
	b := setup(t, testenv.Backends()[1], sqlstore.Mark)
	crashBeforeConsumption(t, b, 3)
	mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{}, nil)
	require.NoError(t, err)
	broken := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	require.NoError(t, broken.Close())
	resubmitter, err := outbox.NewStaleResubmitter(b.reg, broken, outbox.StaleResubmitterConfig{}, nil)
	require.NoError(t, err)
	cleaner, err := outboxops.NewCleaner(b.reg, outboxops.CleanerConfig{}, nil)
	require.NoError(t, err)

	for _, sc := range []struct {
		name string
		// replay configures the replay; sub is the handlers' subscriber.
		replay outbox.ReplayConfig
		sub    func(gc *gochannel.GoChannel) message.Subscriber
	}{
		// The replay's publisher is closed: the replay fails once the
		// subscriptions are open, inside the last one.
		{name: "ReplayFailsAfterTheSubscriptionsOpened", sub: func(gc *gochannel.GoChannel) message.Subscriber { return gc }},
		// The replay waits for the router to run, which it never does: a
		// subscription fails.
		{name: "AfterRunningAndASubscriptionFails", replay: outbox.ReplayConfig{AfterRunning: true},
			sub: func(gc *gochannel.GoChannel) message.Subscriber { return refusingSubscriber{gc} }},
	} {
		t.Run(sc.name, func(t *testing.T) {
			start := func() {
				gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
				defer func() { require.NoError(t, gc.Close()) }()
				router, err := message.NewRouter(message.RouterConfig{CloseTimeout: guard}, nil)
				require.NoError(t, err)
				router.AddMiddleware(mw)
				router.AddPlugin(outbox.ReplayPlugin(b.reg, broken, sc.replay, nil), resubmitter.Plugin(), cleaner.Plugin())
				router.AddNoPublisherHandler("consume", b.topic, gc, func(*message.Message) error { return nil })
				router.AddNoPublisherHandler("audit", "other_"+b.topic, sc.sub(gc), func(*message.Message) error { return nil })
				require.Error(t, router.Run(context.Background()))
			}
			failedStartsLeaveNothing(t, tries, start)
		})
	}
}

// failedStartsLeaveNothing runs start, a start that fails, once and then
// tries times, and checks that the goroutines that it started end, but for
// at most one per start of Watermill's router
// (TestWatermillRouterLeavesAGoroutineAfterAFailedRun).
func failedStartsLeaveNothing(t *testing.T, tries int, start func()) {
	t.Helper()
	start() // anything started once per process is started now
	before, watchers := settledGoroutines(0)
	for range tries {
		start()
	}
	after, router := settledGoroutines(before)
	t.Logf("%d goroutines before %d failed starts, %d after, and %d more of the router's own", before, tries, after, router-watchers)
	assert.LessOrEqual(t, after, before, "the outbox's goroutines end with a failed start:\n%s", goroutineDump())
	assert.LessOrEqual(t, router-watchers, tries, "Watermill's router leaves at most one per failed Run")
}

// refusingSubscriber fails to subscribe.
type refusingSubscriber struct{ message.Subscriber }

func (refusingSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, errors.New("broker refused the subscription")
}

// routerWatcher is the frame of the goroutine that Watermill's router
// leaves behind after a Run that failed once a handler had subscribed.
const routerWatcher = "watermill/message.(*Router).watchAllHandlersStopped"

// settledGoroutines waits, up to the guard, for the count of goroutines
// (the router's watchers apart, which it returns too) to come down to want,
// or with want 0 to stop changing. Goroutines that end send no signal, so
// it polls.
func settledGoroutines(want int) (others, watchers int) {
	deadline := time.Now().Add(guard)
	last := -1
	for {
		others, watchers = countGoroutines()
		if want > 0 && others <= want || want == 0 && others == last || !time.Now().Before(deadline) {
			return others, watchers
		}
		last = others
		time.Sleep(20 * time.Millisecond)
	}
}

func countGoroutines() (others, watchers int) {
	for _, g := range strings.Split(goroutineDump(), "\n\n") {
		if strings.Contains(g, routerWatcher) {
			watchers++
		} else {
			others++
		}
	}
	return others, watchers
}

func goroutineDump() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// TestFailedReplayDrainsWhatItSent: a router on GoChannel with one handler
// of a tracked topic, ReplayPlugin in the default mode (every pending
// record, on a GoChannel) and its stale resubmitter, on each database.
// The replay's second page fails to read, after its first page was sent
// into the handler's subscription, which no handler reads: the start
// fails. Over three failed starts, each copy the subscription delivered is
// nacked (a GoChannel sends a nacked message again until the subscription
// closes), and no goroutine is left behind but the one per start of
// Watermill's router (TestWatermillRouterLeavesAGoroutineAfterAFailedRun).
// Not parallel: the count is the process's.
func TestFailedReplayDrainsWhatItSent(t *testing.T) {
	const tries = 3
	for _, backend := range testenv.Backends() {
		t.Run(backend.Name, func(t *testing.T) {
			b := setup(t, backend, sqlstore.Mark)
			first := crashBeforeConsumption(t, b, 3)[0]
			start := func() {
				delivered := &seenMessages{first: make(chan struct{})}
				reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: laterPagesFail{b.store, delivered.first}})
				require.NoError(t, err)
				mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
				require.NoError(t, err)
				gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
				defer func() { require.NoError(t, gc.Close()) }()
				router, err := message.NewRouter(message.RouterConfig{CloseTimeout: guard}, nil)
				require.NoError(t, err)
				router.AddMiddleware(mw)
				router.AddPlugin(outbox.ReplayPlugin(reg, gc, outbox.ReplayConfig{PageSize: 1}, nil))
				router.AddConsumerHandler("consume", b.topic, delivered.watch(gc), func(*message.Message) error {
					return errors.New("no handler runs: the start fails")
				})
				var replayErr *outbox.ResendError
				require.ErrorAs(t, router.Run(context.Background()), &replayErr)
				assert.ErrorIs(t, replayErr, errLaterPage)

				require.NoError(t, gc.Close())
				msgs := delivered.all()
				require.NotEmpty(t, msgs, "the replay sent its first page into the subscription")
				for _, msg := range msgs {
					assert.Equal(t, first, msg.UUID, "the first page is the first record")
					select {
					case <-msg.Nacked():
					case <-msg.Acked():
						t.Errorf("a copy of %s was acked: its record is pending and nothing handled it", msg.UUID)
					case <-time.After(guard):
						t.Errorf("a copy of %s was left in the subscription, neither acked nor nacked", msg.UUID)
					}
				}
			}
			failedStartsLeaveNothing(t, tries, start)
		})
	}
}

// errLaterPage is the read failure of laterPagesFail.
var errLaterPage = errors.New("the database went away after the first page")

// laterPagesFail is a real store whose reads of pending records fail
// after the first page, once sent is closed: the first page's message has
// reached the subscription (GoChannel delivers it after Publish returned).
type laterPagesFail struct {
	*sqlstore.Store
	sent <-chan struct{}
}

func (s laterPagesFail) PendingAfter(ctx context.Context, topic string, afterID int64, limit int) ([]recordstore.Record, error) {
	if afterID > 0 {
		return nil, s.fail(ctx)
	}
	return s.Store.PendingAfter(ctx, topic, afterID, limit)
}

func (s laterPagesFail) PendingAfterBytes(ctx context.Context, topic string, afterID int64, limit, maxBytes int) ([]recordstore.Record, error) {
	if afterID > 0 {
		return nil, s.fail(ctx)
	}
	return s.Store.PendingAfterBytes(ctx, topic, afterID, limit, maxBytes)
}

func (s laterPagesFail) fail(ctx context.Context) error {
	select {
	case <-s.sent:
	case <-ctx.Done():
	}
	return errLaterPage
}

// seenMessages is a subscriber wrapper that keeps every message its
// subscriptions deliver, and closes first at the first one.
type seenMessages struct {
	mu    sync.Mutex
	msgs  []*message.Message
	first chan struct{}
}

func (s *seenMessages) watch(sub message.Subscriber) message.Subscriber {
	return watchingSubscriber{Subscriber: sub, seen: s}
}

func (s *seenMessages) all() []*message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

type watchingSubscriber struct {
	message.Subscriber
	seen *seenMessages
}

func (w watchingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := w.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for msg := range in {
			w.seen.mu.Lock()
			w.seen.msgs = append(w.seen.msgs, msg)
			if len(w.seen.msgs) == 1 {
				close(w.seen.first)
			}
			w.seen.mu.Unlock()
			out <- msg
		}
	}()
	return out, nil
}
