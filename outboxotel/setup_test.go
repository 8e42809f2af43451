package outboxotel_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxotel"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func TestMain(m *testing.M) {
	// The project's own tests exercise the real path.
	os.Setenv(outbox.EnvToggle, "on")
	os.Exit(m.Run())
}

const topic = "orders"

// traced is a tracer provider that keeps every ended span in memory, and
// the outbox tracer over it.
type traced struct {
	exporter *tracetest.InMemoryExporter
	provider *sdktrace.TracerProvider
	tracer   *outboxotel.Tracer
	// app is the application's own tracer, for the spans a test starts.
	app trace.Tracer
}

func newTraced(t *testing.T) *traced {
	t.Helper()
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	tracer, err := outboxotel.NewTracer(outboxotel.TracerConfig{TracerProvider: provider, Propagator: propagation.TraceContext{}})
	require.NoError(t, err)
	return &traced{exporter: exporter, provider: provider, tracer: tracer, app: provider.Tracer("app")}
}

// span returns the one ended span of that name.
func (tr *traced) span(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	spans := tr.named(name)
	require.Len(t, spans, 1, "spans named %q", name)
	return spans[0]
}

// named returns the ended spans of that name, in the order they ended.
func (tr *traced) named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.exporter.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// attr returns a span's attribute as text, "" when it has none.
func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// contextOf reads the W3C trace context of metadata.
func contextOf(md map[string]string) trace.SpanContext {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(md))
	return trace.SpanContextFromContext(ctx)
}

// bundle is one SQLite table tracked as topic, with its registry.
type bundle struct {
	db    *sqlx.DB
	store *sqlstore.Store
	reg   *outbox.Registry
}

func sqliteBackend(t *testing.T) testenv.Backend {
	t.Helper()
	for _, b := range testenv.Backends() {
		if b.Name == "SQLite" {
			return b
		}
	}
	t.Fatal("no SQLite backend")
	return testenv.Backend{}
}

// setup creates a table on a fresh SQLite file, or on db when given.
func setup(t *testing.T, db *sqlx.DB, consumers ...string) *bundle {
	t.Helper()
	backend := sqliteBackend(t)
	if db == nil {
		db = backend.Open(t)
	}
	store := testenv.NewStore(t, backend, db, sqlstore.Mark)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store, Consumers: consumers})
	require.NoError(t, err)
	return &bundle{db: db, store: store, reg: reg}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (b *bundle) pending(t *testing.T) []recordstore.Record {
	t.Helper()
	recs, err := b.store.PendingAfter(testContext(t), topic, 0, 100)
	require.NoError(t, err)
	return recs
}

// tracingPublisher is an application's tracing decorator, as
// OpenTelemetry instrumentations of Watermill build them: a producer span
// per message, from the message's context, injected into the metadata of
// what it sends. When setsContext is false it leaves the message's context
// as it was, so that only the metadata carries its span.
type tracingPublisher struct {
	message.Publisher
	tracer      trace.Tracer
	setsContext bool
}

func (p tracingPublisher) Publish(topic string, msgs ...*message.Message) error {
	spans := make([]trace.Span, len(msgs))
	for i, msg := range msgs {
		ctx, span := p.tracer.Start(msg.Context(), "app publish "+topic, trace.WithSpanKind(trace.SpanKindProducer))
		propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(msg.Metadata))
		if p.setsContext {
			msg.SetContext(ctx)
		}
		spans[i] = span
	}
	defer func() {
		for _, s := range spans {
			s.End()
		}
	}()
	return p.Publisher.Publish(topic, msgs...)
}

// Unwrap returns the wrapped publisher, so that the outbox's resends find
// the publisher under its decorator.
func (p tracingPublisher) Unwrap() message.Publisher { return p.Publisher }
