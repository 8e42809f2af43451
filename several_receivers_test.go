package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

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

// fanOut is one service whose router has a handler per consumer on one
// tracked topic, on a GoChannel that gives each handler its own copy.
type fanOut struct {
	gc      *gochannel.GoChannel
	pub     message.Publisher
	router  *message.Router
	handled map[string]*handledSet
}

func newFanOut(t *testing.T, b *bundle, want int, consumers ...string) *fanOut {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	pub, err := outbox.NewPublisher(b.reg, gc)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(b.middleware(t))
	router.AddPlugin(outbox.ReplayPlugin(b.reg, gc, outbox.ReplayConfig{}, b.logger))
	f := &fanOut{gc: gc, pub: pub, router: router, handled: map[string]*handledSet{}}
	for _, c := range consumers {
		hs := newHandledSet(want)
		f.handled[c] = hs
		router.AddNoPublisherHandler(c, b.topic, gc, hs.handle)
	}
	return f
}

// run publishes n tracked messages once the router runs, waits until every
// consumer handled all of them, and closes the router.
func (f *fanOut) run(t *testing.T, b *bundle, n int) []string {
	t.Helper()
	runErr := make(chan error, 1)
	go func() { runErr <- f.router.Run(context.Background()) }()
	<-f.router.Running()
	uuids := make([]string, n)
	for i := range uuids {
		uuids[i] = fmt.Sprintf("order-%03d", i)
		require.NoError(t, f.pub.Publish(b.topic, message.NewMessage(uuids[i], []byte(uuids[i]))))
	}
	for c, hs := range f.handled {
		select {
		case <-hs.done:
		case err := <-runErr:
			t.Fatalf("router stopped: %v", err)
		case <-b.ctx(t).Done():
			t.Fatalf("consumer %s handled %d of %d messages", c, len(hs.snapshot()), n)
		}
	}
	require.NoError(t, f.router.Close())
	require.NoError(t, <-runErr)
	return uuids
}

func TestSeveralReceivers(t *testing.T) {
	t.Parallel()

	// Topology: one router, two handlers on one tracked topic that
	// declares both as its consumers (Watermill fan-out on GoChannel).
	t.Run("TwoDeclaredHandlersInOneRouterEachHandleEveryMessage", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
				t.Run(mode.String(), func(t *testing.T) {
					b := setupConsumers(t, backend, mode, "email", "stats")
					const n = 60
					f := newFanOut(t, b, n, "email", "stats")
					uuids := f.run(t, b, n)
					for c, hs := range f.handled {
						got := hs.snapshot()
						for _, u := range uuids {
							assert.Equal(t, 1, got[u], "consumer %s handled %s once", c, u)
						}
					}
					assert.Zero(t, b.pendingCount(t), "every record is complete once both consumers completed it")
				})
			}
		})
	})

	// Topology: one router, two handlers on one tracked topic that
	// declares no consumers.
	t.Run("UndeclaredSecondHandlerLosesNothingAndIsReported", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			const n = 60
			f := newFanOut(t, b, n, "email", "stats")
			uuids := f.run(t, b, n)
			for c, hs := range f.handled {
				got := hs.snapshot()
				for _, u := range uuids {
					assert.GreaterOrEqual(t, got[u], 1, "consumer %s handled %s", c, u)
				}
			}
			assert.Zero(t, b.pendingCount(t), "the first handler completes the records")
			var atStart, named bool
			for _, e := range b.logger.Entries("error") {
				text := e.Err.Error()
				atStart = atStart || strings.Contains(text, "2 subscriptions")
				named = named || (strings.Contains(text, `"email"`) && strings.Contains(text, `"stats"`) && strings.Contains(text, "Consumers"))
			}
			assert.True(t, atStart, "the second subscription is reported at start")
			assert.True(t, named, "the error names both handlers and the fix")
		})
	})

	// Topology: a restarted service with two declared handlers: replay
	// resends a record while one consumer has not completed it, and the
	// consumer that did skips its copy.
	t.Run("ReplayResendsUntilEveryConsumerCompleted", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setupConsumers(t, backend, sqlstore.Mark, "email", "stats")
			uuids := crashBeforeConsumption(t, b, 25)
			// Only "email" runs first: "stats" is deployed later.
			first := newFanOut(t, b, len(uuids), "email")
			runUntilHandled(t, b, first.router, first.handled["email"])
			assert.Equal(t, len(uuids), b.pendingCount(t), "records stay pending while stats has not completed them")

			second := newFanOut(t, b, len(uuids), "email", "stats")
			runUntilHandled(t, b, second.router, second.handled["stats"])
			assert.Empty(t, second.handled["email"].snapshot(), "email already completed every record: its copies are skipped")
			got := second.handled["stats"].snapshot()
			for _, u := range uuids {
				assert.Equal(t, 1, got[u], "stats handled %s once", u)
			}
			assert.Zero(t, b.pendingCount(t))
		})
	})

	t.Run("AnotherTablesMessageRunsUntrackedAndTouchesNothing", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			foreign := msg.Copy()
			foreign.Metadata.Set(outbox.MetadataTable, "another-service-table")
			h := &recordingHandler{}
			_, err := b.middleware(t)(h.handle)(foreign)
			require.NoError(t, err)
			assert.EqualValues(t, 1, h.runs.Load(), "another service's message is handled")
			assert.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), "and this table's record with the same id is not touched")
			assert.Empty(t, b.logger.Entries("error"))
		})
	})

	// Topology: one router whose handler subscribes to "orders"; a message
	// on that topic names the pending record of "refunds".
	t.Run("AnotherTopicsRecordIsNeverCompleted", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			refunds := "refunds_" + b.store.Table()
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store}, outbox.Tracked{Topic: refunds, Store: b.store})
			require.NoError(t, err)
			b.reg = reg
			refund := []recordstore.Record{{Topic: refunds, UUID: "refund-1"}}
			require.NoError(t, b.store.Insert(b.ctx(t), refund))
			identity, err := b.store.Identity(b.ctx(t))
			require.NoError(t, err)

			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			router.AddMiddleware(b.middleware(t))
			handled := newHandledSet(2)
			router.AddNoPublisherHandler("orders", b.topic, gc, handled.handle)
			runErr := make(chan error, 1)
			go func() { runErr <- router.Run(context.Background()) }()
			<-router.Running()

			// Names the refund: not this topic's, handled untracked.
			named := message.NewMessage("names-refunds", nil)
			named.Metadata = message.Metadata{outbox.MetadataID: fmt.Sprint(refund[0].ID), outbox.MetadataTopic: refunds, outbox.MetadataTable: identity}
			// Claims to be an order but carries the refund's id: the
			// table has no order with that id, so it is acked unhandled.
			lying := message.NewMessage("claims-orders", nil)
			lying.Metadata = message.Metadata{outbox.MetadataID: fmt.Sprint(refund[0].ID), outbox.MetadataTopic: b.topic, outbox.MetadataTable: identity}
			require.NoError(t, gc.Publish(b.topic, named, lying))
			// A real order after them, to know when they went through.
			pub, err := outbox.NewPublisher(b.reg, gc)
			require.NoError(t, err)
			require.NoError(t, pub.Publish(b.topic, message.NewMessage("order-1", nil)))
			select {
			case <-handled.done:
			case <-b.ctx(t).Done():
				t.Fatalf("handled %v", handled.snapshot())
			}
			require.NoError(t, router.Close())
			require.NoError(t, <-runErr)

			got := handled.snapshot()
			assert.Equal(t, 1, got["names-refunds"], "a message naming another topic runs untracked")
			assert.Zero(t, got["claims-orders"], "an id with no record of this topic is acked unhandled")
			assert.NoError(t, b.store.CheckPending(b.ctx(t), recordstore.Delivery{ID: refund[0].ID, Topic: refunds}), "the refund stays pending")
		})
	})

	t.Run("UndeclaredConsumerOfDeclaredTopicRunsUntracked", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setupConsumers(t, backend, sqlstore.Mark, "email")
			const n = 10
			f := newFanOut(t, b, n, "email", "audit")
			uuids := f.run(t, b, n)
			for c, hs := range f.handled {
				got := hs.snapshot()
				for _, u := range uuids {
					assert.Equal(t, 1, got[u], "consumer %s handled %s once", c, u)
				}
			}
			assert.Zero(t, b.pendingCount(t))
			var named bool
			for _, e := range b.logger.Entries("error") {
				named = named || strings.Contains(e.Err.Error(), `"audit"`)
			}
			assert.True(t, named, "the undeclared handler is reported")
		})
	})

	t.Run("ConsumersAreValidated", func(t *testing.T) {
		t.Parallel()
		store := &sqlstore.Store{}
		_, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, Consumers: []string{"email", ""}})
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
		_, err = outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, Consumers: []string{"email", "email"}})
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
	})
}

// setupConsumers is setup with a topic that declares its consumers.
func setupConsumers(t *testing.T, backend testenv.Backend, mode sqlstore.Completion, consumers ...string) *bundle {
	t.Helper()
	b := setup(t, backend, mode)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store, Consumers: consumers})
	require.NoError(t, err)
	b.reg = reg
	return b
}
