package outboxmetrics_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxmetrics"
	"github.com/wmoutbox/outbox/outboxtest"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func TestMain(m *testing.M) {
	os.Setenv(outbox.EnvToggle, "on")
	os.Exit(m.Run())
}

// gather scrapes the collector and returns each sample as "name{label}".
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func TestCollectorCountsTheFlowAndReadsTheBacklog(t *testing.T) {
	t.Parallel()
	for _, backend := range testenv.Backends() {
		t.Run(backend.Name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := backend.Open(t)
			store := testenv.NewStore(t, backend, db, sqlstore.Mark)
			name := "orders"
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: name, Store: store})
			require.NoError(t, err)
			c, err := outboxmetrics.NewCollector(reg, outboxmetrics.Config{Namespace: "app"}, nil)
			require.NoError(t, err)
			reg.SetObserver(c)

			gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			sub, err := gc.Subscribe(ctx, name)
			require.NoError(t, err)
			pub, err := outbox.NewPublisher(reg, gc)
			require.NoError(t, err)
			require.NoError(t, pub.Publish(name,
				message.NewMessage("ok", nil), message.NewMessage("poison", nil), message.NewMessage("waiting", nil)))
			delivered := map[string]*message.Message{}
			for range 3 {
				m := <-sub
				m.Ack()
				delivered[m.UUID] = m.Copy()
			}

			mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{MaxAttempts: 1}, nil)
			require.NoError(t, err)
			ok := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			fail := mw(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("boom") })
			_, err = ok(delivered["ok"].Copy())
			require.NoError(t, err)
			require.NoError(t, reg.WaitCompletions(ctx), "the completion runs in the background")
			_, err = ok(delivered["ok"].Copy())
			require.NoError(t, err, "a copy of a completed record is skipped")
			_, err = fail(delivered["poison"])
			require.True(t, outbox.IsAbandoned(err))
			forged := delivered["waiting"].Copy()
			forged.UUID = "forged"
			_, err = ok(forged)
			require.NoError(t, err, "a message naming another message's record is acked")
			replayed, err := outbox.Replay(ctx, reg, gc, outbox.ReplayConfig{}, nil)
			require.NoError(t, err)
			require.Equal(t, 1, replayed.Total(), "only the waiting record is replayed")

			got := gather(t, c)
			assert.Equal(t, map[string]float64{
				"app_outbox_records_published_total{orders}":      3,
				"app_outbox_records_completed_total{}{orders}":    1,
				"app_outbox_duplicates_skipped_total{}{orders}":   1,
				"app_outbox_handler_failures_total{}{orders}":     1,
				"app_outbox_records_abandoned_total{}{orders}":    1,
				"app_outbox_mismatched_messages_total{}{orders}":  1,
				"app_outbox_records_resent_total{replay}{orders}": 1,
				"app_outbox_pending_records{orders}":              1,
				"app_outbox_oldest_pending_age_seconds{orders}":   got["app_outbox_oldest_pending_age_seconds{orders}"],
				// The receiver's check is recorded off the handler's path:
				// 1 or 0 here (TestCollectorReportsUncheckedRecords).
				"app_outbox_unchecked_records{orders}": got["app_outbox_unchecked_records{orders}"],
				"app_outbox_held_keys{orders}":         0,
				"app_outbox_status_read_errors":        0,
			}, got)
			age := got["app_outbox_oldest_pending_age_seconds{orders}"]
			assert.True(t, age >= 0 && age < time.Hour.Seconds(), "oldest pending age %v s by the database clock", age)
		})
	}
}

// TestCollectorReportsUncheckedRecords: a topic received by "ship" and by
// "billing", a remote consumer whose service never confirms. Its records
// are unchecked until billing is seen (as its first matching confirmation
// records it), on every store.
func TestCollectorReportsUncheckedRecords(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) recordstore.Store{
		"InMemory": func(*testing.T) recordstore.Store { return outboxtest.NewStore(outboxtest.StoreConfig{}) },
	}
	for _, backend := range testenv.Backends() {
		stores[backend.Name] = func(t *testing.T) recordstore.Store {
			return testenv.NewStore(t, backend, backend.Open(t), sqlstore.Mark)
		}
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			store := newStore(t)
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, Consumers: []string{"ship"}, RemoteConsumers: []string{"billing"}})
			require.NoError(t, err)
			c, err := outboxmetrics.NewCollector(reg, outboxmetrics.Config{}, nil)
			require.NoError(t, err)
			deliveries := []string{"ship", "billing"}
			recs := []recordstore.Record{{Topic: "orders", UUID: "a", Consumers: deliveries}, {Topic: "orders", UUID: "b", Consumers: deliveries}}
			require.NoError(t, store.Insert(ctx, recs))
			rr := store.(recordstore.ConsumerRecorder)
			require.NoError(t, rr.SawConsumer(ctx, "orders", "ship"))
			for _, r := range recs {
				require.NoError(t, store.Complete(ctx, recordstore.Delivery{ID: r.ID, Topic: "orders", Consumer: "ship"}))
			}

			got := gather(t, c)
			assert.Equal(t, 2.0, got["outbox_unchecked_records{orders}"], "both records wait for billing, never seen")
			assert.Equal(t, 2.0, got["outbox_consumer_unchecked_records{billing}{orders}"])

			require.NoError(t, rr.SawConsumer(ctx, "orders", "billing"))
			got = gather(t, c)
			assert.Equal(t, 2.0, got["outbox_pending_records{orders}"])
			assert.Zero(t, got["outbox_unchecked_records{orders}"], "billing was seen")
			assert.Zero(t, got["outbox_consumer_unchecked_records{billing}{orders}"])
		})
	}
}

func TestCollectorBreaksTheBacklogDownPerConsumer(t *testing.T) {
	for _, backend := range testenv.Backends() {
		t.Run(backend.Name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			store := testenv.NewStore(t, backend, backend.Open(t), sqlstore.Mark)
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, Consumers: []string{"email", "stats"}})
			require.NoError(t, err)
			c, err := outboxmetrics.NewCollector(reg, outboxmetrics.Config{}, nil)
			require.NoError(t, err)
			recs := []recordstore.Record{{Topic: "orders", UUID: "a", Consumers: reg.Consumers("orders")}, {Topic: "orders", UUID: "b", Consumers: reg.Consumers("orders")}}
			require.NoError(t, store.Insert(ctx, recs))
			require.NoError(t, store.Complete(ctx, recordstore.Delivery{ID: recs[0].ID, Topic: "orders", Consumer: "email"}))

			got := gather(t, c)
			assert.Equal(t, 2.0, got["outbox_pending_records{orders}"], "a record is pending while one consumer has not completed it")
			assert.Equal(t, 1.0, got["outbox_consumer_pending_records{email}{orders}"])
			assert.Equal(t, 2.0, got["outbox_consumer_pending_records{stats}{orders}"])
		})
	}
}
