package outbox_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/outboxtest"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// seenStore signals each receiver it records as seen, once recorded.
type seenStore struct {
	*sqlstore.Store
	seen chan string
}

func (s seenStore) SawConsumer(ctx context.Context, topic, consumer string) error {
	err := s.Store.SawConsumer(ctx, topic, consumer)
	s.seen <- consumer
	return err
}

// watched makes a peer's store signal on seen.
func watched(seen chan string) func(*sqlstore.Store) recordstore.Store {
	return func(s *sqlstore.Store) recordstore.Store { return seenStore{Store: s, seen: seen} }
}

// waitSeen waits until the store recorded consumer as seen.
func waitSeen(t *testing.T, ctx context.Context, seen chan string, consumer string) {
	t.Helper()
	for {
		select {
		case c := <-seen:
			if c == consumer {
				return
			}
		case <-ctx.Done():
			t.Fatalf("receiver %q was never recorded as seen", consumer)
		}
	}
}

// topicStatus reads the status of one topic of the peer's registry.
func (p *peer) topicStatus(t *testing.T, topic string, full bool) outboxops.TopicStatus {
	t.Helper()
	sts, err := outboxops.ReadStatus(testCtx(t), p.reg, outboxops.StatusOptions{Full: full})
	require.NoError(t, err)
	for _, st := range sts {
		if st.Topic == topic {
			return st
		}
	}
	t.Fatalf("no status of %q in %v", topic, sts)
	return outboxops.TopicStatus{}
}

// consumerStatus is the consumer's share of st.
func consumerStatus(t *testing.T, st outboxops.TopicStatus, consumer string) outboxops.ConsumerStatus {
	t.Helper()
	for _, cs := range st.Consumers {
		if cs.Consumer == consumer {
			return cs
		}
	}
	t.Fatalf("no status of consumer %q in %+v", consumer, st)
	return outboxops.ConsumerStatus{}
}

// withoutReceivers is the consumers' status without the receiver fields,
// for the tests of other things: the receivers' checks are recorded off the
// handler's path.
func withoutReceivers(sts []outboxops.ConsumerStatus) []outboxops.ConsumerStatus {
	out := make([]outboxops.ConsumerStatus, len(sts))
	for i, cs := range sts {
		cs.Unchecked, cs.Seen, cs.SinceSeen = 0, false, 0
		out[i] = cs
	}
	return out
}

// TestUncheckedRecords: the status counts the pending records that wait
// for a receiver never seen, in topologies that never complete and in
// those that do.
func TestUncheckedRecords(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		t.Run("RemoteConsumerThatNeverConfirms", func(t *testing.T) {
			// Topology: A tracks orders, received by "ship" in A and by
			// "billing" in service B, whose middleware has no
			// confirmation publisher: billing handles and never confirms.
			// Then an instance of B with one starts, and billing's next
			// delivery confirms.
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			ctx := testCtx(t)
			seen := make(chan string, 64)
			a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", Consumers: []string{"ship"}, RemoteConsumers: []string{"billing"}}},
				outbox.MiddlewareConfig{}, watched(seen))
			a.handle("ship", "orders", broker, nil)
			silent := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{})
			silent.handle("billing", "orders", broker, nil)
			a.start(t)
			silent.start(t)

			uuids := publishN(t, a.pub, "orders", "order", 3)
			a.waitRan(t, ctx, "ship", uuids)
			silent.waitRan(t, ctx, "billing", uuids)
			waitSeen(t, ctx, seen, "ship")

			st := a.topicStatus(t, "orders", true)
			assert.Equal(t, int64(3), st.Pending)
			assert.Equal(t, int64(3), st.Unchecked, "every record waits for billing, which never confirmed")
			billing := consumerStatus(t, st, "billing")
			assert.Equal(t, int64(3), billing.Unchecked)
			assert.False(t, billing.Seen)
			ship := consumerStatus(t, st, "ship")
			assert.Zero(t, ship.Unchecked)
			assert.True(t, ship.Seen)
			assert.Equal(t, int64(3), a.topicStatus(t, "orders", false).Unchecked, "the pending status counts them too")

			confirming := newPeer(t, b, "B2", broker, nil, outbox.MiddlewareConfig{Confirmations: broker})
			confirming.handle("billing", "orders", broker, nil)
			confirming.start(t)
			late := publishN(t, a.pub, "orders", "late", 1)
			confirming.waitRan(t, ctx, "billing", late)
			waitSeen(t, ctx, seen, "billing")

			st = a.topicStatus(t, "orders", true)
			assert.GreaterOrEqual(t, st.Pending, int64(3), "the records billing handled without confirming stay pending")
			assert.Zero(t, st.Unchecked, "billing confirmed once: it runs, and the records wait for it, not for nobody")
			billing = consumerStatus(t, st, "billing")
			assert.Zero(t, billing.Unchecked)
			assert.True(t, billing.Seen)
			assert.Less(t, billing.SinceSeen, time.Minute)
		})

		t.Run("DeclaredLocalConsumerNeverDeployed", func(t *testing.T) {
			// Topology: one service tracks orders for its consumers "ship"
			// and "audit"; its router runs ship only.
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			ctx := testCtx(t)
			seen := make(chan string, 64)
			a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", Consumers: []string{"audit", "ship"}}}, outbox.MiddlewareConfig{}, watched(seen))
			a.handle("ship", "orders", broker, nil)
			a.start(t)

			uuids := publishN(t, a.pub, "orders", "order", 2)
			a.waitRan(t, ctx, "ship", uuids)
			waitSeen(t, ctx, seen, "ship")
			assert.Empty(t, seen, "a receiver is recorded once a minute, not once per delivery")

			st := a.topicStatus(t, "orders", true)
			assert.Equal(t, int64(2), st.Unchecked)
			audit := consumerStatus(t, st, "audit")
			assert.Equal(t, int64(2), audit.Pending)
			assert.Equal(t, int64(2), audit.Unchecked, "audit was declared and never deployed")
			assert.False(t, audit.Seen)
			assert.True(t, consumerStatus(t, st, "ship").Seen)
		})

		t.Run("OneReceiverThatChecks", func(t *testing.T) {
			// Topology: one service tracks orders, which declares no
			// consumers, and its router runs one handler of it.
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			ctx := testCtx(t)
			seen := make(chan string, 64)
			a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders"}}, outbox.MiddlewareConfig{}, watched(seen))
			a.handle("orders_handler", "orders", broker, nil)

			before := publishN(t, a.pub, "orders", "before", 1) // nobody subscribes yet
			st := a.topicStatus(t, "orders", false)
			assert.Equal(t, int64(1), st.Unchecked, "no receiver has checked the topic yet")
			assert.False(t, st.Seen)

			a.start(t) // the replay sends the pending record
			a.waitRan(t, ctx, "orders_handler", before)
			a.waitDrained(t, ctx, "orders") // completed, a moment after the handler ran
			waitSeen(t, ctx, seen, "orders_handler")
			// Sent where nobody subscribes: they stay pending.
			elsewhere := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = elsewhere.Close() })
			unheard, err := outbox.NewPublisher(a.reg, elsewhere)
			require.NoError(t, err)
			publishN(t, unheard, "orders", "after", 2)

			st = a.topicStatus(t, "orders", false)
			assert.Equal(t, int64(2), st.Pending)
			assert.Zero(t, st.Unchecked, "its receiver checks the topic: the records wait for it")
			assert.True(t, st.Seen)
			assert.Nil(t, st.Consumers)
		})
	})
}

// TestStatusHandlerServesTheDocumentedJSON: docs/operations.md shows what
// the status handler serves for orders, received by "ship" here and by
// "billing" in a service that never confirmed; the handler serves exactly
// that, on an in-memory store whose clock the test sets.
func TestStatusHandlerServesTheDocumentedJSON(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/operations.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(doc), "## HTTP status")
	require.True(t, ok)
	_, block, ok := strings.Cut(section, "```json\n")
	require.True(t, ok)
	want, _, ok := strings.Cut(block, "\n```")
	require.True(t, ok)

	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	store := outboxtest.NewStore(outboxtest.StoreConfig{Now: clock})
	reg, err := outbox.NewTrackingRegistry(outbox.Tracked{Topic: "orders", Store: store, Consumers: []string{"ship"}, RemoteConsumers: []string{"billing"}})
	require.NoError(t, err)
	ctx := testCtx(t)
	require.NoError(t, store.SawConsumer(ctx, "orders", "ship"))
	set(now.Add(40400 * time.Millisecond))
	recs := []recordstore.Record{{Topic: "orders", UUID: "a", Consumers: []string{"ship", "billing"}}, {Topic: "orders", UUID: "b", Consumers: []string{"ship", "billing"}}}
	require.NoError(t, store.Insert(ctx, recs))
	require.NoError(t, store.Complete(ctx, recordstore.Delivery{ID: recs[0].ID, Topic: "orders", Consumer: "ship"}))
	set(now.Add(800 * time.Millisecond))

	h, err := outboxops.NewStatusHandler(reg, outboxops.StatusHandlerConfig{}, nil)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/outbox/status", nil))
	assert.Equal(t, http.StatusOK, rec.Code, "unchecked records younger than MaxPendingAge keep the status healthy")
	assert.Equal(t, want, strings.TrimSpace(rec.Body.String()))
}
