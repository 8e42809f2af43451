package outboxotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxotel"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// collect reads every data point as "name{attribute values}", the values
// in attribute key order (consumer before topic).
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]float64{}
	key := func(name string, attrs []string) string {
		return name + "{" + strings.Join(attrs, "}{") + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, outboxotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				require.True(t, d.IsMonotonic, "%s is a counter", m.Name)
				for _, p := range d.DataPoints {
					out[key(m.Name, values(p.Attributes.ToSlice()))] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, values(p.Attributes.ToSlice()))] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, values(p.Attributes.ToSlice()))] = p.Value
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// values are the attribute values, in key order.
func values(kvs []attribute.KeyValue) []string {
	out := make([]string, len(kvs))
	for i, kv := range kvs {
		out[i] = kv.Value.Emit()
	}
	return out
}

func newMetrics(t *testing.T, reg *outbox.Registry, cfg outboxotel.MetricsConfig) (*outboxotel.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	cfg.MeterProvider = provider
	m, err := outboxotel.NewMetrics(reg, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m, reader
}

func TestMetricsCountTheFlowAndReadTheBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	m, reader := newMetrics(t, b.reg, outboxotel.MetricsConfig{Namespace: "app"})
	b.reg.SetObserver(m)

	gc, sub := receive(t)
	pub, err := outbox.NewPublisher(b.reg, gc)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(topic,
		message.NewMessage("ok", nil), message.NewMessage("poison", nil), message.NewMessage("waiting", nil)))
	delivered := map[string]*message.Message{}
	for range 3 {
		msg := next(t, sub)
		delivered[msg.UUID] = msg
	}

	mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{MaxAttempts: 1}, nil)
	require.NoError(t, err)
	ok := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	fail := mw(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("boom") })
	_, err = ok(delivered["ok"].Copy())
	require.NoError(t, err)
	_, err = ok(delivered["ok"].Copy())
	require.NoError(t, err, "a copy of a completed record is skipped")
	_, err = fail(delivered["poison"])
	require.True(t, outbox.IsAbandoned(err))
	forged := delivered["waiting"].Copy()
	forged.UUID = "forged"
	_, err = ok(forged)
	require.NoError(t, err, "a message naming another message's record is acked")
	replayed, err := outbox.Replay(testContext(t), b.reg, gc, outbox.ReplayConfig{}, nil)
	require.NoError(t, err)
	require.Equal(t, 1, replayed.Total(), "only the waiting record is replayed")

	got := collect(t, reader)
	age := got["app.outbox.oldest_pending_age{orders}"]
	assert.True(t, age >= 0 && age < time.Hour.Seconds(), "oldest pending age %v s by the database clock", age)
	assert.Equal(t, map[string]float64{
		"app.outbox.records_published{orders}":      3,
		"app.outbox.records_completed{}{orders}":    1,
		"app.outbox.duplicates_skipped{}{orders}":   1,
		"app.outbox.handler_failures{}{orders}":     1,
		"app.outbox.records_abandoned{}{orders}":    1,
		"app.outbox.mismatched_messages{}{orders}":  1,
		"app.outbox.records_resent{replay}{orders}": 1,
		"app.outbox.pending_records{orders}":        1,
		"app.outbox.oldest_pending_age{orders}":     age,
		// The receiver's check is recorded off the handler's path: 1 or
		// 0 here (TestMetricsReportUncheckedRecords).
		"app.outbox.unchecked_records{orders}": got["app.outbox.unchecked_records{orders}"],
		"app.outbox.status_read_errors{}":      0,
	}, got)
}

// TestMetricsReportUncheckedRecords: a topic declares the consumers "email"
// and "stats"; stats was never deployed. Its records are unchecked until
// stats is seen.
func TestMetricsReportUncheckedRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, "email", "stats")
	_, reader := newMetrics(t, b.reg, outboxotel.MetricsConfig{})
	ctx := testContext(t)
	recs := []recordstore.Record{{Topic: topic, UUID: "a", Consumers: b.reg.Consumers(topic)}, {Topic: topic, UUID: "b", Consumers: b.reg.Consumers(topic)}}
	require.NoError(t, b.store.Insert(ctx, recs))
	require.NoError(t, b.store.SawConsumer(ctx, topic, "email"))
	require.NoError(t, b.store.Complete(ctx, recordstore.Delivery{ID: recs[0].ID, Topic: topic, Consumer: "email"}))

	got := collect(t, reader)
	assert.Equal(t, 2.0, got["outbox.unchecked_records{orders}"], "both records wait for stats, never seen")
	assert.Equal(t, 2.0, got["outbox.consumer_unchecked_records{stats}{orders}"])
	assert.Equal(t, 0.0, got["outbox.consumer_unchecked_records{email}{orders}"])

	require.NoError(t, b.store.SawConsumer(ctx, topic, "stats"))
	got = collect(t, reader)
	assert.Equal(t, 0.0, got["outbox.unchecked_records{orders}"])
	assert.Equal(t, 0.0, got["outbox.consumer_unchecked_records{stats}{orders}"])
}

func TestMetricsBreakTheBacklogDownPerConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, "email", "stats")
	_, reader := newMetrics(t, b.reg, outboxotel.MetricsConfig{})
	ctx := testContext(t)
	recs := []recordstore.Record{{Topic: topic, UUID: "a", Consumers: b.reg.Consumers(topic)}, {Topic: topic, UUID: "b", Consumers: b.reg.Consumers(topic)}}
	require.NoError(t, b.store.Insert(ctx, recs))
	require.NoError(t, b.store.Complete(ctx, recordstore.Delivery{ID: recs[0].ID, Topic: topic, Consumer: "email"}))

	got := collect(t, reader)
	assert.Equal(t, 2.0, got["outbox.pending_records{orders}"], "a record is pending while one consumer has not completed it")
	assert.Equal(t, 1.0, got["outbox.consumer_pending_records{email}{orders}"])
	assert.Equal(t, 2.0, got["outbox.consumer_pending_records{stats}{orders}"])
	assert.Contains(t, got, "outbox.consumer_oldest_pending_age{email}{orders}")
}

func TestMetricsReportABacklogThatCannotBeRead(t *testing.T) {
	t.Parallel()
	db := sqliteBackend(t).Open(t)
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store})
	require.NoError(t, err)
	_, reader := newMetrics(t, reg, outboxotel.MetricsConfig{})
	assert.Equal(t, map[string]float64{"outbox.status_read_errors{}": 1}, collect(t, reader))
}

func TestMetricsConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for name, cfg := range map[string]outboxotel.MetricsConfig{
		"NegativeReadTimeout": {ReadTimeout: -time.Second},
		"DottedNamespace":     {Namespace: "app.svc"},
	} {
		_, err := outboxotel.NewMetrics(b.reg, cfg, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig, name)
	}
	_, err := outboxotel.NewMetrics(nil, outboxotel.MetricsConfig{}, nil)
	assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
}
