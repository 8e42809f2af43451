package outboxotel_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	_ "modernc.org/sqlite"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxotel"
	"github.com/wmoutbox/outbox/sqlstore"
)

// exampleStore opens a SQLite file in a temp dir with its outbox table.
func exampleStore() (*sqlstore.Store, func()) {
	dir, _ := os.MkdirTemp("", "outboxotel-example")
	db := sqlx.MustOpen("sqlite", "file:"+filepath.Join(dir, "outbox.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	db.SetMaxOpenConns(1)
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	return store, func() { db.Close(); os.RemoveAll(dir) }
}

// A service traces its tracked messages by giving the registry a tracer:
// the publish, the check, the handler and the completion of an order are one
// trace. Without TracerConfig fields, the tracer uses the global tracer
// provider and propagator that the application's OpenTelemetry setup sets.
func ExampleNewTracer() {
	store, cleanup := exampleStore()
	defer cleanup()
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	if err != nil {
		panic(err)
	}

	// The application's OpenTelemetry setup; this one keeps spans in memory.
	spans := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	tracer, err := outboxotel.NewTracer(outboxotel.TracerConfig{TracerProvider: provider, Propagator: propagation.TraceContext{}})
	if err != nil {
		panic(err)
	}
	reg.SetTracer(tracer)

	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	mw, _ := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	router.AddMiddleware(mw)
	router.AddPlugin(outbox.ReplayPlugin(reg, pubSub, outbox.ReplayConfig{}, nil))
	shipped := make(chan struct{})
	router.AddNoPublisherHandler("ship", "orders", pubSub, func(msg *message.Message) error {
		_, span := provider.Tracer("shipping").Start(msg.Context(), "ship order") // the handler's context is in the trace
		defer span.End()
		close(shipped)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	pub, _ := outbox.NewPublisher(reg, pubSub)
	ctx, span := provider.Tracer("checkout").Start(context.Background(), "place order")
	msg := message.NewMessage(watermill.NewUUID(), []byte("order-1"))
	msg.SetContext(ctx)
	if err := pub.Publish("orders", msg); err != nil {
		panic(err)
	}
	span.End()
	<-shipped
	_ = router.Close() // waits for the handler and the completion

	var names []string
	traces := map[trace.TraceID]bool{}
	for _, s := range spans.GetSpans() {
		names = append(names, s.Name)
		traces[s.SpanContext.TraceID()] = true
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Println(name)
	}
	fmt.Println("one trace:", len(traces) == 1)
	// Output:
	// outbox check orders
	// outbox complete orders
	// outbox publish orders
	// place order
	// ship order
	// one trace: true
}

// The outbox's counters and backlog gauges as OpenTelemetry metrics, beside
// or instead of the outboxmetrics package's Prometheus collector. Without
// MetricsConfig.MeterProvider they go to the global meter provider.
func ExampleNewMetrics() {
	store, cleanup := exampleStore()
	defer cleanup()
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	if err != nil {
		panic(err)
	}

	// The application's OpenTelemetry setup; this one is read on demand.
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	metrics, err := outboxotel.NewMetrics(reg, outboxotel.MetricsConfig{MeterProvider: provider, ReadTimeout: 5 * time.Second}, nil)
	if err != nil {
		panic(err)
	}
	defer metrics.Close()
	reg.SetObserver(metrics)

	pub, _ := outbox.NewPublisher(reg, gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}))
	_ = pub.Publish("orders", message.NewMessage(watermill.NewUUID(), nil), message.NewMessage(watermill.NewUUID(), nil))

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			fmt.Println(m.Name, d.DataPoints[0].Value)
		case metricdata.Gauge[int64]:
			if m.Name == "outbox.pending_records" {
				fmt.Println(m.Name, d.DataPoints[0].Value)
			}
		}
	}
	// Output:
	// outbox.records_published 2
	// outbox.pending_records 2
}
