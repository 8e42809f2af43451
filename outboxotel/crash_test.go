package outboxotel_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxotel"
	"github.com/wmoutbox/outbox/sqlstore"
)

// Environment of the child process of TestTraceSurvivesACrash.
const (
	envCrashChild = "OUTBOX_OTEL_CRASH_CHILD" // "publisher" or "tx"
	envCrashDSN   = "OUTBOX_OTEL_CRASH_DSN"
	envCrashTable = "OUTBOX_OTEL_CRASH_TABLE"
	// The child's lines: a span it started, and the send it halts in.
	lineSpan    = "SPAN"
	lineSending = "SENDING"
)

// childSpan is a span the child started, as it printed it.
type childSpan struct {
	name           string
	trace          trace.TraceID
	span, parentID trace.SpanID
}

// TestTraceSurvivesACrash publishes a tracked message in a real process
// that is killed (SIGKILL) once the record is committed, while it sends the
// message; the restarted service replays it from the same SQLite file and
// handles it through a router with the outbox middleware. The handling
// continues the trace the child's publish span started: the resend is its
// child, and the check, the handler and the completion are the resend's.
func TestTraceSurvivesACrash(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"publisher", "tx"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dsn := testenv.SQLiteDSN(t)
			db := testenv.Open(t, "SQLite", "sqlite", dsn)
			b := setup(t, db)

			spans := runCrashingChild(t, mode, dsn, b.store.Table())
			publish, ok := spans["outbox publish "+topic]
			require.True(t, ok, "the child started its publish span: %v", spans)
			order := spans["place order"]
			assert.Equal(t, order.trace, publish.trace)
			assert.Equal(t, order.span, publish.parentID, "the publish span is a child of the child's own span")
			recs := b.pending(t)
			require.Len(t, recs, 1, "the record was committed and never sent")
			saved := contextOf(recs[0].Metadata)
			assert.Equal(t, publish.trace, saved.TraceID(), "the record keeps the child's trace")
			assert.Equal(t, publish.span, saved.SpanID())

			tr := newTraced(t)
			b.reg.SetTracer(tr.tracer)
			ran := restartAndHandle(t, b, tr)

			resend := tr.span(t, "outbox resend "+topic)
			assert.Equal(t, publish.trace, resend.SpanContext.TraceID(), "the replay continues the trace across the restart")
			assert.Equal(t, publish.span, resend.Parent.SpanID(), "as a child of the child's publish span")
			assert.True(t, resend.Parent.IsRemote())
			assert.Equal(t, "replay", attr(resend, string(outboxotel.AttrResend)))
			assert.Equal(t, strconv.FormatInt(recs[0].ID, 10), attr(resend, string(outboxotel.AttrRecordID)))

			assert.Equal(t, publish.trace, ran.TraceID(), "the handler runs in the trace")
			assert.Equal(t, resend.SpanContext.SpanID(), ran.SpanID(), "under the resend")
			ship := tr.span(t, "ship order")
			assert.Equal(t, publish.trace, ship.SpanContext.TraceID())
			assert.Equal(t, resend.SpanContext.SpanID(), ship.Parent.SpanID(), "the handler's own span is a child of the resend")
			for _, name := range []string{"outbox check " + topic, "outbox complete " + topic} {
				s := tr.span(t, name)
				assert.Equal(t, publish.trace, s.SpanContext.TraceID(), name)
				assert.Equal(t, resend.SpanContext.SpanID(), s.Parent.SpanID(), name)
				assert.Equal(t, "ship", attr(s, string(outboxotel.AttrConsumer)), name)
			}
			assert.Equal(t, "pending", attr(tr.span(t, "outbox check "+topic), string(outboxotel.AttrCheck)))
			assert.Empty(t, b.pending(t), "the handling completed the record")
		})
	}
}

// runCrashingChild runs the child until it sends, kills it, and returns the
// spans it started by name.
func runCrashingChild(t *testing.T, mode, dsn, table string) map[string]childSpan {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTraceSurvivesACrashChild$", "-test.count=1")
	child.Env = append(os.Environ(), envCrashChild+"="+mode, envCrashDSN+"="+dsn, envCrashTable+"="+table)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	spans := map[string]childSpan{}
	sending := false
	lines := bufio.NewScanner(out)
	for !sending && lines.Scan() {
		fields := strings.Split(strings.TrimSpace(lines.Text()), "|")
		switch fields[0] {
		case lineSending:
			sending = true
		case lineSpan:
			require.Len(t, fields, 5, "span line %q", lines.Text())
			var s childSpan
			var err error
			s.name = fields[1]
			s.trace, err = trace.TraceIDFromHex(fields[2])
			require.NoError(t, err)
			s.span, err = trace.SpanIDFromHex(fields[3])
			require.NoError(t, err)
			if fields[4] != "" {
				s.parentID, err = trace.SpanIDFromHex(fields[4])
				require.NoError(t, err)
			}
			spans[s.name] = s
		}
	}
	require.True(t, sending, "the child stopped before it sent")
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	err = child.Wait()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "killed")
	return spans
}

// restartAndHandle runs the restarted service: a router on a fresh
// GoChannel (what the child sent died with it), with the outbox middleware
// and the replay plugin, until the handler of the replayed message has
// finished and its record was completed. It returns the span context the
// handler ran in.
func restartAndHandle(t *testing.T, b *bundle, tr *traced) trace.SpanContext {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	settled := make(chan struct{}, 1)
	// Outside the outbox middleware: it returns once the record is
	// completed.
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			select {
			case settled <- struct{}{}:
			default: // a second handling; the count below tells
			}
			return out, err
		}
	})
	mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{}, nil)
	require.NoError(t, err)
	router.AddMiddleware(mw)
	router.AddPlugin(outbox.ReplayPlugin(b.reg, gc, outbox.ReplayConfig{}, nil))
	ran := make(chan trace.SpanContext, 4)
	router.AddNoPublisherHandler("ship", topic, gc, func(msg *message.Message) error {
		_, span := tr.app.Start(msg.Context(), "ship order")
		defer span.End()
		ran <- trace.SpanContextFromContext(msg.Context())
		return nil
	})

	ctx := testContext(t)
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-settled:
	case err := <-runErr:
		t.Fatalf("router stopped: %v", err)
	case <-ctx.Done():
		t.Fatal("the replayed message was not handled")
	}
	require.NoError(t, router.Close())
	require.NoError(t, <-runErr)
	require.Len(t, ran, 1, "handled once")
	return <-ran
}

// TestTraceSurvivesACrashChild is the process TestTraceSurvivesACrash
// kills; it does nothing on its own. It prints each span it starts and
// halts in the send of a tracked message whose record it committed.
func TestTraceSurvivesACrashChild(t *testing.T) {
	mode := os.Getenv(envCrashChild)
	if mode == "" {
		t.Skip("runs only as the child of TestTraceSurvivesACrash")
	}
	db := testenv.Open(t, "SQLite", "sqlite", os.Getenv(envCrashDSN))
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), Table: os.Getenv(envCrashTable), DB: db})
	require.NoError(t, err)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store})
	require.NoError(t, err)
	// The spans never end before the kill; they are printed as they start.
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(printingProcessor{}))
	tracer, err := outboxotel.NewTracer(outboxotel.TracerConfig{TracerProvider: provider, Propagator: propagation.TraceContext{}})
	require.NoError(t, err)
	reg.SetTracer(tracer)

	ctx, _ := provider.Tracer("app").Start(context.Background(), "place order")
	msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
	msg.SetContext(ctx)
	switch mode {
	case "publisher":
		pub, err := outbox.NewPublisher(reg, haltingPublisher{})
		require.NoError(t, err)
		_ = pub.Publish(topic, msg) // halts in the send
	case "tx":
		txPub, err := outbox.NewTxPublisher(reg, haltingPublisher{})
		require.NoError(t, err)
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		ptx := txPub.Wrap(tx)
		require.NoError(t, ptx.Publish(ctx, topic, msg))
		_ = ptx.Commit() // commits, then halts in the send
	}
	t.Fatal("the send returned")
}

// printingProcessor prints each span as it starts: name, trace, span and
// parent span ids.
type printingProcessor struct{}

func (printingProcessor) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	parent := ""
	if s.Parent().IsValid() {
		parent = s.Parent().SpanID().String()
	}
	fmt.Printf("%s|%s|%s|%s|%s\n", lineSpan, s.Name(), s.SpanContext().TraceID(), s.SpanContext().SpanID(), parent)
}

func (printingProcessor) OnEnd(sdktrace.ReadOnlySpan)      {}
func (printingProcessor) Shutdown(context.Context) error   { return nil }
func (printingProcessor) ForceFlush(context.Context) error { return nil }

// haltingPublisher tells the parent that the send started and never
// returns.
type haltingPublisher struct{}

func (haltingPublisher) Publish(string, ...*message.Message) error {
	fmt.Println(lineSending)
	time.Sleep(time.Hour) // a timer, unlike select{}, is never taken for a deadlock
	return fmt.Errorf("not killed")
}

func (haltingPublisher) Close() error { return nil }
