package outbox_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestRetireWithoutARegistryRefusesAConsumerTheLatestStartDeclares: a
// topic declares "email", handled by this service (one router on
// GoChannel), and "stats", of another service that shares the store and is
// down; 5 records are pending. An operator's tool without the registry
// (outboxctl, the dashboard: the store's Retire) is asked to retire
// "stats" after each start.
func TestRetireWithoutARegistryRefusesAConsumerTheLatestStartDeclares(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setupConsumers(t, backend, sqlstore.Mark, "email", "stats")
		const n = 5
		crashBeforeConsumption(t, b, n)

		c := newCopies()
		b.redeclare(t, c, "email", "stats")
		restartWith(t, b, c, "email")
		retired, err := b.store.Retire(b.ctx(t), b.topic, "stats")
		var declared *recordstore.ConsumerDeclaredError
		require.ErrorAs(t, err, &declared, "the latest start declares stats")
		assert.Zero(t, retired)
		assert.Equal(t, b.topic, declared.Topic)
		assert.Equal(t, "stats", declared.Consumer)
		assert.False(t, declared.Remote)
		assert.Contains(t, err.Error(), "ago", "the refusal says when the start declared it")
		assert.Equal(t, n, b.pendingCount(t), "stats' deliveries are still pending")

		// Redeployed without stats: the same retire works.
		b.redeclare(t, c, "email")
		restartWith(t, b, c, "email")
		retired, err = b.store.Retire(b.ctx(t), b.topic, "stats")
		require.NoError(t, err)
		assert.Equal(t, n, retired)
		assert.Zero(t, b.pendingCount(t))
	})
}

// TestRetireWithoutARegistryRefusesADeclaredRemoteConsumer: a topic with a
// remote consumer, "billing", in a service with a database of its own; the
// sender's start (outbox.Replay) declares it, and a retire through the
// store alone is refused until a start no longer declares it.
func TestRetireWithoutARegistryRefusesADeclaredRemoteConsumer(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		start := func(remote ...string) {
			t.Helper()
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store, RemoteConsumers: remote})
			require.NoError(t, err)
			b.reg = reg
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			_, err = outbox.Replay(b.ctx(t), reg, gc, outbox.ReplayConfig{}, b.logger)
			require.NoError(t, err)
		}
		start("billing", "shipping")
		crashBeforeConsumption(t, b, 2)

		_, err := b.store.Retire(b.ctx(t), b.topic, "billing")
		var declared *recordstore.ConsumerDeclaredError
		require.ErrorAs(t, err, &declared)
		assert.True(t, declared.Remote)
		assert.Contains(t, err.Error(), "RemoteConsumers")

		start("shipping")
		n, err := b.store.Retire(b.ctx(t), b.topic, "billing")
		require.NoError(t, err)
		assert.Equal(t, 2, n)
	})
}

// TestStatusShowsTheDeliveriesAwaitingConfirmation: a topic with a local
// consumer, "email", and a remote consumer, "billing", in a service with a
// database of its own, which has confirmed nothing. ReadStatus and the
// status handler tell the remote consumer and its deliveries awaiting
// confirmation, from the registry before any start and from the start's
// declarations for a reader without the registry (outboxctl, the
// dashboard).
func TestStatusShowsTheDeliveriesAwaitingConfirmation(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store, Consumers: []string{"email"}, RemoteConsumers: []string{"billing"}})
		require.NoError(t, err)
		b.reg = reg
		msgs := crashBeforeConsumption(t, b, 3)
		require.Len(t, msgs, 3)

		sts, err := outboxops.ReadStatus(b.ctx(t), reg, outboxops.StatusOptions{})
		require.NoError(t, err)
		require.Len(t, sts, 1)
		require.Len(t, sts[0].Consumers, 2)
		billing := sts[0].Consumers[0]
		assert.Equal(t, "billing", billing.Consumer)
		assert.True(t, billing.Remote, "the registry declares billing remote")
		assert.Equal(t, int64(3), billing.Pending, "awaiting billing's confirmation")
		assert.Positive(t, billing.OldestPending)
		assert.False(t, sts[0].Consumers[1].Remote, "email shares the store")

		h, err := outboxops.NewStatusHandler(reg, outboxops.StatusHandlerConfig{}, b.logger)
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status", nil))
		var body struct {
			Topics []struct {
				Consumers []struct {
					Consumer      string  `json:"consumer"`
					Remote        bool    `json:"remote"`
					Pending       int64   `json:"pending"`
					OldestPending float64 `json:"oldest_pending_seconds"`
				} `json:"consumers"`
			} `json:"topics"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
		require.Len(t, body.Topics, 1)
		require.Len(t, body.Topics[0].Consumers, 2)
		assert.Equal(t, "billing", body.Topics[0].Consumers[0].Consumer)
		assert.True(t, body.Topics[0].Consumers[0].Remote)
		assert.Equal(t, int64(3), body.Topics[0].Consumers[0].Pending)
		assert.Positive(t, body.Topics[0].Consumers[0].OldestPending)
		assert.False(t, body.Topics[0].Consumers[1].Remote)

		// The store alone knows once a start declared it.
		before, err := b.store.PendingStatus(b.ctx(t))
		require.NoError(t, err)
		require.Len(t, before, 1)
		assert.False(t, before[0].Consumers[0].Remote, "no start declared billing yet")
		gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		t.Cleanup(func() { _ = gc.Close() })
		_, err = outbox.Replay(b.ctx(t), reg, gc, outbox.ReplayConfig{}, b.logger)
		require.NoError(t, err)
		after, err := b.store.PendingStatus(b.ctx(t))
		require.NoError(t, err)
		require.Len(t, after, 1)
		assert.True(t, after[0].Consumers[0].Remote)
		assert.Equal(t, int64(3), after[0].Consumers[0].Pending)
	})
}
