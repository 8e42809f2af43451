package outboxtest_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxtest"
	"github.com/wmoutbox/outbox/recordstore"
)

// kit is what a test of a handler sets up.
type kit struct {
	store *outboxtest.Store
	reg   *outbox.Registry
	pub   *outboxtest.Publisher
}

func setup(t *testing.T, tracked ...outbox.Tracked) kit {
	t.Helper()
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	if len(tracked) == 0 {
		tracked = []outbox.Tracked{{Topic: "orders"}}
	}
	for i := range tracked {
		tracked[i].Store = store
	}
	reg := outboxtest.NewRegistry(t, tracked...)
	return kit{store: store, reg: reg, pub: outboxtest.NewPublisher(t, reg)}
}

// publish publishes one tracked message and returns it as sent.
func (k kit) publish(t *testing.T, payload string) *message.Message {
	t.Helper()
	require.NoError(t, k.pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(payload))))
	sent := k.pub.Sent("orders")
	return sent[len(sent)-1]
}

func ok(*message.Message) error { return nil }

func TestDeliverCompletesTheRecordAndSkipsItsCopy(t *testing.T) {
	t.Parallel()
	k := setup(t)
	msg := k.publish(t, "order 1")
	recs := outboxtest.RequirePublished(t, k.store, "orders")
	require.Len(t, recs, 1)
	assert.Equal(t, msg.UUID, recs[0].UUID)
	assert.Equal(t, "order 1", string(recs[0].Payload))
	outboxtest.RequirePending(t, k.store, "orders", 1)

	var seen message.Metadata
	got := outboxtest.Deliver(t, k.reg, "ship_orders", "orders", func(m *message.Message) error {
		seen = m.Metadata
		ref, ok := outbox.RecordFromContext(m.Context())
		assert.True(t, ok, "the handler runs tracked")
		assert.Equal(t, outbox.RecordRef{Topic: "orders", ID: recs[0].ID, Consumer: "ship_orders"}, ref)
		return nil
	}, msg)
	assert.Equal(t, outboxtest.Outcome{Acked: true, Tracked: true, Runs: 1}, got)
	assert.NotContains(t, seen, outbox.MetadataID, "the handler sees the message without the outbox keys")
	info := outboxtest.RequireCompleted(t, k.store, recs[0].ID)
	assert.Equal(t, "ship_orders", info.CompletedBy)
	outboxtest.RequirePending(t, k.store, "orders", 0)

	again := outboxtest.Deliver(t, k.reg, "ship_orders", "orders", ok, msg)
	assert.Equal(t, outboxtest.Outcome{Acked: true, Tracked: true, Runs: 0}, again, "a copy of a completed record is acked unhandled")
}

func TestDeliverLeavesAFailedRecordPending(t *testing.T) {
	t.Parallel()
	k := setup(t)
	msg := k.publish(t, "order 1")
	boom := errors.New("warehouse down")
	got := outboxtest.Deliver(t, k.reg, "ship_orders", "orders", func(*message.Message) error { return boom }, msg)
	assert.False(t, got.Acked)
	assert.Equal(t, 1, got.Runs)
	assert.ErrorIs(t, got.Err, boom)

	pending := outboxtest.RequirePending(t, k.store, "orders", 1)
	info, found := k.store.Record(pending[0].ID)
	require.True(t, found)
	assert.Equal(t, 1, info.Attempts)
	assert.Equal(t, "warehouse down", info.LastError)

	early := outboxtest.Deliver(t, k.reg, "ship_orders", "orders", ok, msg)
	assert.False(t, early.Acked, "a copy that comes before the backoff has run out is nacked")
	assert.Zero(t, early.Runs)
	assert.NoError(t, early.Err, "the outbox nacks a held copy itself: a hold is routine, not an error")
}

func TestDeliverRecoversAPanic(t *testing.T) {
	t.Parallel()
	k := setup(t)
	got := outboxtest.Deliver(t, k.reg, "ship_orders", "orders", func(*message.Message) error { panic("no stock") }, k.publish(t, "order 1"))
	assert.False(t, got.Acked)
	assert.Equal(t, 1, got.Runs)
	require.Error(t, got.Err)
	assert.Contains(t, got.Err.Error(), "no stock")
	outboxtest.RequirePending(t, k.store, "orders", 1)
}

func TestDeliverToDeclaredConsumers(t *testing.T) {
	t.Parallel()
	k := setup(t, outbox.Tracked{Topic: "orders", Consumers: []string{"billing", "shipping"}})
	msg := k.publish(t, "order 1")
	id := outboxtest.RequirePublished(t, k.store, "orders")[0].ID

	assert.Equal(t, outboxtest.Outcome{Acked: true, Tracked: true, Runs: 1}, outboxtest.Deliver(t, k.reg, "billing", "orders", ok, msg))
	info := outboxtest.RequirePending(t, k.store, "orders", 1)[0]
	assert.Equal(t, []string{"billing", "shipping"}, info.Consumers)
	assert.Equal(t, outboxtest.Outcome{Acked: true, Tracked: true, Runs: 0}, outboxtest.Deliver(t, k.reg, "billing", "orders", ok, msg), "billing's copy")
	assert.Equal(t, outboxtest.Outcome{Acked: true, Tracked: true, Runs: 1}, outboxtest.Deliver(t, k.reg, "shipping", "orders", ok, msg))
	done := outboxtest.RequireCompleted(t, k.store, id)
	assert.Equal(t, []recordstore.DeliveryInfo{
		{Consumer: "billing", State: outboxtest.Completed},
		{Consumer: "shipping", State: outboxtest.Completed},
	}, done.Deliveries)
}

func TestDeliverToASecondHandlerOfAOneReceiverTopic(t *testing.T) {
	t.Parallel()
	k := setup(t)
	msg := k.publish(t, "order 1")
	require.True(t, outboxtest.Deliver(t, k.reg, "ship_orders", "orders", ok, msg).Acked)
	var tracked bool
	var got outboxtest.Outcome
	failure := fatal(t, func(tb testing.TB) {
		got = outboxtest.Deliver(tb, k.reg, "audit_orders", "orders", func(m *message.Message) error {
			_, tracked = outbox.RecordFromContext(m.Context())
			return nil
		}, msg)
	})
	assert.Equal(t, outboxtest.Outcome{Acked: true, Runs: 1}, got, "the second handler is not skipped, and not tracked")
	assert.False(t, tracked, "it runs untracked")
	assert.Contains(t, failure, `declares no consumers and another handler received it: declare both in Tracked.Consumers`)
}

func TestDeliverUntrackedMessage(t *testing.T) {
	t.Parallel()
	k := setup(t)
	got := outboxtest.Deliver(t, k.reg, "ship_orders", "orders", ok, message.NewMessage("plain", nil))
	assert.Equal(t, outboxtest.Outcome{Acked: true, Runs: 1}, got)
	outboxtest.RequireNotPublished(t, k.store, "orders")
}

func TestDeliverWithTheServicesMiddlewareConfig(t *testing.T) {
	t.Parallel()
	k := setup(t)
	msg := k.publish(t, "order 1")
	var abandoned *outbox.AbandonedError
	cfg := outbox.MiddlewareConfig{MaxAttempts: 2, OnAbandon: func(_ *message.Message, err *outbox.AbandonedError) { abandoned = err }, Backoff: outbox.Backoff{Disabled: true}}
	poison := errors.New("unparseable order")
	fail := func(*message.Message) error { return poison }

	first := outboxtest.DeliverWith(t, k.reg, cfg, "ship_orders", "orders", fail, msg)
	assert.False(t, first.Acked, "the first failure leaves the record for a retry")
	assert.Nil(t, abandoned)
	second := outboxtest.DeliverWith(t, k.reg, cfg, "ship_orders", "orders", fail, msg)
	assert.Equal(t, 1, second.Runs)
	var abandonedErr *outbox.AbandonedError
	assert.ErrorAs(t, second.Err, &abandonedErr, "the middleware returns the AbandonedError")
	require.NotNil(t, abandoned, "the second failure is the last allowed: OnAbandon is called")
	assert.ErrorIs(t, abandoned, poison)
	info := outboxtest.RequireAbandoned(t, k.store, outboxtest.RequirePublished(t, k.store, "orders")[0].ID)
	assert.Equal(t, 2, info.Attempts)
}

func TestDeliverWithAnInvalidConfigFails(t *testing.T) {
	t.Parallel()
	k := setup(t)
	msg := fatal(t, func(tb testing.TB) {
		outboxtest.DeliverWith(tb, k.reg, outbox.MiddlewareConfig{MaxAttempts: -1}, "ship_orders", "orders", ok, k.publish(t, "order 1"))
	})
	assert.Contains(t, msg, "MaxAttempts -1 is negative")
}

func TestRequireAbandoned(t *testing.T) {
	t.Parallel()
	k := setup(t)
	require.NoError(t, k.pub.Publish("orders", message.NewMessage("m", nil)))
	id := outboxtest.RequirePublished(t, k.store, "orders")[0].ID
	_, abandoned, err := k.store.RecordFailure(t.Context(), recordstore.Delivery{ID: id, Topic: "orders", Consumer: "ship_orders"}, "poison", 1, nil)
	require.NoError(t, err)
	require.True(t, abandoned)
	info := outboxtest.RequireAbandoned(t, k.store, id)
	assert.Equal(t, "poison", info.LastError)
}

func TestDeletingStoreStillReportsCompletedRecords(t *testing.T) {
	t.Parallel()
	store := outboxtest.NewStore(outboxtest.StoreConfig{DeleteCompleted: true})
	reg := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store})
	pub := outboxtest.NewPublisher(t, reg)
	require.NoError(t, pub.Publish("orders", message.NewMessage("m", nil)))
	require.True(t, outboxtest.Deliver(t, reg, "ship_orders", "orders", ok, pub.Sent("orders")[0]).Acked)
	id := outboxtest.RequirePublished(t, store, "orders")[0].ID
	info := outboxtest.RequireCompleted(t, store, id)
	assert.True(t, info.Gone, "the store deleted it")
	recs, err := store.PendingAfter(t.Context(), "orders", 0, 10)
	require.NoError(t, err)
	assert.Empty(t, recs)
}

func TestHelpersFailWithWhatTheStoreHolds(t *testing.T) {
	t.Parallel()
	k := setup(t)
	k.publish(t, "order 1")
	id := outboxtest.RequirePublished(t, k.store, "orders")[0].ID

	for name, tc := range map[string]struct {
		run  func(tb testing.TB)
		want string
	}{
		"PublishedToAnotherTopic": {func(tb testing.TB) { outboxtest.RequirePublished(tb, k.store, "refunds") }, `no record was saved for topic "refunds"; the store has records of ["orders"]`},
		"NotPublished":            {func(tb testing.TB) { outboxtest.RequireNotPublished(tb, k.store, "orders") }, `1 record(s) were saved for topic "orders", want none`},
		"Pending":                 {func(tb testing.TB) { outboxtest.RequirePending(tb, k.store, "orders", 0) }, `1 record(s) of topic "orders" are pending, want 0`},
		"Completed":               {func(tb testing.TB) { outboxtest.RequireCompleted(tb, k.store, id) }, "is pending, want completed"},
		"Abandoned":               {func(tb testing.TB) { outboxtest.RequireAbandoned(tb, k.store, id) }, "is pending, want abandoned"},
		"NeverSaved":              {func(tb testing.TB) { outboxtest.RequireCompleted(tb, k.store, 99) }, "no record 99 was saved"},
	} {
		t.Run(name, func(t *testing.T) {
			msg := fatal(t, tc.run)
			assert.Contains(t, msg, tc.want)
		})
	}
}

func TestDeliverRefusesARegistryThatDoesNotTrack(t *testing.T) {
	t.Setenv(outbox.EnvToggle, "")
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: outboxtest.NewStore(outboxtest.StoreConfig{})})
	require.NoError(t, err)
	msg := fatal(t, func(tb testing.TB) {
		outboxtest.Deliver(tb, reg, "ship_orders", "orders", ok, message.NewMessage("m", nil))
	})
	assert.Contains(t, msg, "outboxtest.NewRegistry")
}

// fatal runs fn with a testing.TB whose Fatalf stops fn, and returns the
// message fn failed with; it fails the test when fn does not fail.
func fatal(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	tb := &fatalTB{TB: t}
	var wg sync.WaitGroup
	wg.Go(func() { fn(tb) })
	wg.Wait()
	require.True(t, tb.failed, "the helper did not fail the test")
	return tb.msg
}

// fatalTB records a Fatalf instead of failing the test.
type fatalTB struct {
	testing.TB
	failed bool
	msg    string
}

func (tb *fatalTB) Helper() {}

func (tb *fatalTB) Fatalf(format string, args ...any) {
	tb.failed = true
	tb.msg = strings.TrimSpace(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

// Errorf records an error and lets the helper go on, as testing.T does.
func (tb *fatalTB) Errorf(format string, args ...any) {
	tb.failed = true
	tb.msg = strings.TrimSpace(fmt.Sprintf(format, args...))
}

// A handler name that is not a declared consumer runs untracked: the
// router acks, the record stays pending, and Deliver fails the test naming
// the fix instead of passing for a success.
func TestDeliverFailsAnUndeclaredHandlerName(t *testing.T) {
	t.Parallel()
	k := setup(t, outbox.Tracked{Topic: "orders", Consumers: []string{"ship", "stats"}})
	require.NoError(t, k.pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("order-1"))))
	var got outboxtest.Outcome
	msg := fatal(t, func(tb testing.TB) {
		got = outboxtest.Deliver(tb, k.reg, "ship_orders", "orders", ok, k.pub.Sent("orders")[0])
	})
	assert.Contains(t, msg, `handler "ship_orders" ran untracked`)
	assert.Contains(t, msg, `not one of the topic's declared consumers ["ship" "stats"]`)
	assert.Contains(t, msg, "add it to Tracked.Consumers")
	assert.Equal(t, outboxtest.Outcome{Acked: true, Runs: 1}, got, "acked and run, but not tracked")
	outboxtest.RequirePending(t, k.store, "orders", 1)

	tracked := outboxtest.Deliver(t, k.reg, "ship", "orders", ok, k.pub.Sent("orders")[0])
	assert.True(t, tracked.Tracked)
}

// RequirePublished fails when no record has what the matchers ask, and
// lists the records.
func TestRequirePublishedMatchersFailWithTheRecords(t *testing.T) {
	t.Parallel()
	k := setup(t, outbox.Tracked{Topic: "orders"})
	require.NoError(t, k.pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("order-1"))))
	msg := fatal(t, func(tb testing.TB) {
		outboxtest.RequirePublished(tb, k.store, "orders", outboxtest.WithPayload([]byte("order-2")))
	})
	assert.Contains(t, msg, `none of the 1 record(s) of topic "orders" has payload "order-2"`)
}

// Records an outboxtest.Tx saves keep their id order among the records
// saved while it was open.
func TestInsertTxKeepsIDOrder(t *testing.T) {
	t.Parallel()
	k := setup(t, outbox.Tracked{Topic: "orders"})
	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = broker.Close() })
	txPub, err := outbox.NewTxPublisher(k.reg, broker)
	require.NoError(t, err)
	tx := txPub.Wrap(outboxtest.NewTx())
	require.NoError(t, tx.Publish(t.Context(), "orders", message.NewMessage(watermill.NewUUID(), []byte("in tx"))))
	require.NoError(t, k.pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("after"))))
	require.NoError(t, tx.Commit())
	recs := outboxtest.RequirePending(t, k.store, "orders", 2)
	assert.Equal(t, "in tx", string(recs[0].Payload))
	assert.Less(t, recs[0].ID, recs[1].ID)
}
