package outbox_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestForgedConfirmationsCompleteNothing: a confirmation completes a
// remote consumer's delivery only when its table identity, topic, record
// id, message UUID and consumer all match; every other one is counted and
// completes nothing.
func TestForgedConfirmationsCompleteNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		store := testenv.NewStore(t, b, b.Open(t), sqlstore.Mark)
		reg, err := outbox.NewRegistry(
			outbox.Tracked{Topic: "orders", Store: store, RemoteConsumers: []string{"billing", "shipping"}},
			outbox.Tracked{Topic: "refunds", Store: store, RemoteConsumers: []string{"billing"}})
		require.NoError(t, err)
		obs := &confirmTally{tally: newTally(), handled: make(chan struct{}, 1)}
		reg.SetObserver(obs)
		identity, err := store.Identity(ctx)
		require.NoError(t, err)
		rec := []recordstore.Record{{Topic: "orders", UUID: "order-1", Payload: []byte("{}"), Consumers: []string{"billing", "shipping"}}}
		require.NoError(t, store.Insert(ctx, rec))
		other := []recordstore.Record{{Topic: "refunds", UUID: "refund-1", Payload: []byte("{}"), Consumers: []string{"billing"}}}
		require.NoError(t, store.Insert(ctx, other))
		logger := &testenv.CaptureLogger{}
		handler, err := outbox.NewConfirmationHandler(reg, outbox.ConfirmationHandlerConfig{}, logger)
		require.NoError(t, err)

		confirm := func(payload string) {
			t.Helper()
			require.NoError(t, handler(message.NewMessage(watermill.NewUUID(), []byte(payload))))
		}
		good := fmt.Sprintf(`{"store":%q,"topic":"orders","id":%d,"uuid":"order-1","consumer":"billing"}`, identity, rec[0].ID)
		forged := []string{
			strings.Replace(good, `"uuid":"order-1"`, `"uuid":"order-2"`, 1),                                           // another message
			strings.Replace(good, `"consumer":"billing"`, `"consumer":"stats"`, 1),                                     // undeclared consumer
			strings.Replace(good, `"topic":"orders"`, `"topic":"refunds"`, 1),                                          // another topic's record
			strings.Replace(good, identity, "0123456789abcdef0123456789abcdef", 1),                                     // another table
			strings.Replace(good, fmt.Sprintf(`"id":%d`, rec[0].ID), fmt.Sprintf(`"id":%d`, other[0].ID), 1),           // another record
			strings.Replace(good, fmt.Sprintf(`"id":%d`, rec[0].ID), `"id":999999`, 1),                                 // no record
			strings.Replace(good, `"uuid"`, `"held_id":1,"key":"k","uuid"`, 1),                                         // held, with an id
			strings.Replace(good, fmt.Sprintf(`"id":%d`, rec[0].ID), fmt.Sprintf(`"id":0,"held_id":%d`, rec[0].ID), 1), // held, no key
			`{"store":"x"}`, `not json`, ``, `{"store":"` + strings.Repeat("x", 5000) + `"}`,
		}
		for _, p := range forged {
			confirm(p)
		}
		assert.Equal(t, int64(len(forged)), obs.rejected.Load(), "each forged confirmation counted")
		assert.Zero(t, obs.get("handled"))
		for _, c := range []string{"billing", "shipping"} {
			assert.NoError(t, store.CheckPending(ctx, recordstore.Delivery{ID: rec[0].ID, Topic: "orders", Consumer: c}), "%s still pending", c)
		}
		assert.NoError(t, store.CheckPending(ctx, recordstore.Delivery{ID: other[0].ID, Topic: "refunds", Consumer: "billing"}))

		// A held message of a topic without an order key: nothing to
		// hold it for; logged, and completing nothing.
		confirm(strings.Replace(good, fmt.Sprintf(`"id":%d`, rec[0].ID), fmt.Sprintf(`"id":0,"held_id":%d,"key":"k"`, rec[0].ID), 1))
		assert.NoError(t, store.CheckPending(ctx, recordstore.Delivery{ID: rec[0].ID, Topic: "orders", Consumer: "billing"}))

		confirm(good)
		assert.Equal(t, 1, obs.get("handled"))
		assert.ErrorIs(t, store.CheckPending(ctx, recordstore.Delivery{ID: rec[0].ID, Topic: "orders", Consumer: "billing"}), recordstore.ErrNotPending)
		assert.NoError(t, store.CheckPending(ctx, recordstore.Delivery{ID: rec[0].ID, Topic: "orders", Consumer: "shipping"}), "the other consumer's delivery stays pending")

		confirm(good) // replayed
		assert.Equal(t, 1, obs.get("handled"))
		assert.Equal(t, 1, obs.get("duplicate"))
	})
}

// FuzzConfirmation feeds arbitrary confirmation payloads to the handler on
// a real SQLite store holding one pending record with two remote
// consumers. Whatever the input, the handler never panics, and a delivery
// completes only when the payload names exactly the record's table
// identity, topic, id and message UUID and one of its declared remote
// consumers.
func FuzzConfirmation(f *testing.F) {
	backend := testenv.Backends()[1]
	store := testenv.NewStore(f, backend, backend.Open(f), sqlstore.Mark)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, RemoteConsumers: []string{"billing", "shipping"}},
		outbox.Tracked{Topic: "refunds", Store: store, RemoteConsumers: []string{"billing"}})
	if err != nil {
		f.Fatal(err)
	}
	ctx := f.Context()
	identity, err := store.Identity(ctx)
	if err != nil {
		f.Fatal(err)
	}
	handler, err := outbox.NewConfirmationHandler(reg, outbox.ConfirmationHandlerConfig{}, nil)
	if err != nil {
		f.Fatal(err)
	}
	good := func(id int64, consumer string) string {
		return fmt.Sprintf(`{"store":%q,"topic":"orders","id":%d,"uuid":"order-1","consumer":%q}`, identity, id, consumer)
	}
	for _, seed := range []string{
		good(1, "billing"), good(1, "shipping"), good(2, "billing"), good(1, "stats"), good(-1, "billing"),
		`{"store":"x","topic":"orders","id":1,"uuid":"order-1","consumer":"billing"}`, `{}`, `null`, `[]`, `"x"`, ``,
		`{"store":` + fmt.Sprintf("%q", identity) + `,"topic":"orders","id":1e0,"uuid":"order-1","consumer":"billing"}`,
		`{"store":` + fmt.Sprintf("%q", identity) + `,"topic":"orders","id":"1","uuid":"order-1","consumer":"billing"}`,
		`{"store":` + fmt.Sprintf("%q", identity) + `,"topic":"orders","id":1,"uuid":"order-1","consumer":"billing","extra":1}`,
		`{"store":` + fmt.Sprintf("%q", identity) + `,"topic":"orders","id":0,"held_id":1,"uuid":"order-1","consumer":"billing","key":"k"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		recs := []recordstore.Record{{Topic: "orders", UUID: "order-1", Payload: []byte("{}"), Consumers: []string{"billing", "shipping"}}}
		require.NoError(t, store.Insert(ctx, recs))
		id := recs[0].ID
		if err := handler(message.NewMessage(watermill.NewUUID(), payload)); err != nil {
			t.Fatalf("a confirmation that the database could answer was nacked: %v", err)
		}
		var c struct {
			Store    string `json:"store"`
			Topic    string `json:"topic"`
			ID       int64  `json:"id"`
			UUID     string `json:"uuid"`
			Consumer string `json:"consumer"`
		}
		parsed := json.Unmarshal(payload, &c) == nil
		for _, consumer := range []string{"billing", "shipping"} {
			err := store.CheckPending(ctx, recordstore.Delivery{ID: id, Topic: "orders", Consumer: consumer})
			if err == nil {
				continue
			}
			require.ErrorIs(t, err, recordstore.ErrNotPending)
			if !parsed || c.Store != identity || c.Topic != "orders" || c.ID != id || c.UUID != "order-1" || c.Consumer != consumer {
				t.Fatalf("the delivery to %s completed on confirmation %q", consumer, payload)
			}
		}
	})
}

// TestDeclaringRemoteConsumersOnAPendingBacklog: records saved while the
// topic declared no receivers (a deploy before the receiving services were
// declared) are completed by the remote consumers declared later: each
// confirmation gives the record a delivery per declared consumer first, so
// the record completes only once both have confirmed.
func TestDeclaringRemoteConsumersOnAPendingBacklog(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
			t.Run(mode.String(), func(t *testing.T) {
				ctx := testCtx(t)
				store := testenv.NewStore(t, b, b.Open(t), mode)
				identity, err := store.Identity(ctx)
				require.NoError(t, err)
				recs := []recordstore.Record{{Topic: "orders", UUID: "order-1", Payload: []byte("{}")}, {Topic: "orders", UUID: "order-2", Payload: []byte("{}")}}
				require.NoError(t, store.Insert(ctx, recs)) // saved with no consumers

				reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, RemoteConsumers: []string{"billing", "shipping"}})
				require.NoError(t, err)
				handler, err := outbox.NewConfirmationHandler(reg, outbox.ConfirmationHandlerConfig{}, nil)
				require.NoError(t, err)
				confirm := func(r recordstore.Record, consumer string) {
					t.Helper()
					payload := fmt.Sprintf(`{"store":%q,"topic":"orders","id":%d,"uuid":%q,"consumer":%q}`, identity, r.ID, r.UUID, consumer)
					require.NoError(t, handler(message.NewMessage(watermill.NewUUID(), []byte(payload))))
				}
				pending := func() int {
					t.Helper()
					left, err := store.PendingAfter(ctx, "orders", 0, 10)
					require.NoError(t, err)
					return len(left)
				}
				for _, r := range recs {
					confirm(r, "billing")
				}
				assert.Equal(t, 2, pending(), "shipping has not confirmed: billing's confirmation completed no record")
				for _, r := range recs {
					confirm(r, "shipping")
				}
				assert.Zero(t, pending(), "both remote consumers confirmed")
			})
		}
	})
}

// TestRetiringARemoteConsumer: a remote consumer removed from the
// declaration keeps its records pending until it is retired; while it is
// still declared, retiring it is refused.
func TestRetiringARemoteConsumer(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		store := testenv.NewStore(t, b, b.Open(t), sqlstore.Mark)
		recs := []recordstore.Record{{Topic: "orders", UUID: "order-1", Payload: []byte("{}"), Consumers: []string{"billing", "shipping"}}}
		require.NoError(t, store.Insert(ctx, recs))
		require.NoError(t, store.Complete(ctx, recordstore.Delivery{ID: recs[0].ID, Topic: "orders", Consumer: "billing", UUID: "order-1"}))

		before, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, RemoteConsumers: []string{"billing", "shipping"}})
		require.NoError(t, err)
		_, err = outboxops.RetireConsumer(ctx, before, "orders", "shipping")
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "a declared remote consumer is not retired")

		after, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, RemoteConsumers: []string{"billing"}})
		require.NoError(t, err)
		n, err := outboxops.RetireConsumer(ctx, after, "orders", "shipping")
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		left, err := store.PendingAfter(ctx, "orders", 0, 10)
		require.NoError(t, err)
		assert.Empty(t, left)
	})
}
