package outboxotel_test

import (
	"context"
	"maps"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxotel"
	"github.com/wmoutbox/outbox/sqlstore"
)

func TestTracerConfig(t *testing.T) {
	t.Parallel()
	_, err := outboxotel.NewTracer(outboxotel.TracerConfig{Propagator: propagation.NewCompositeTextMapPropagator()})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig, "a propagator that propagates nothing would save no trace context")
	tr, err := outboxotel.NewTracer(outboxotel.TracerConfig{Propagator: propagation.TraceContext{}})
	require.NoError(t, err, "the global tracer provider is the default")
	require.NotNil(t, tr)
}

// receive subscribes to topic on a fresh GoChannel and returns it with the
// subscription.
func receive(t *testing.T) (*gochannel.GoChannel, <-chan *message.Message) {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	sub, err := gc.Subscribe(testContext(t), topic)
	require.NoError(t, err)
	return gc, sub
}

func next(t *testing.T, sub <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m := <-sub:
		m.Ack()
		// GoChannel cancels the context of an acked message; hand on a
		// copy, as a redelivery.
		return m.Copy()
	case <-testContext(t).Done():
		t.Fatal("no message received")
		return nil
	}
}

func TestTraceContextIsSavedWhateverTheDecoratorOrder(t *testing.T) {
	t.Parallel()

	t.Run("TracingDecoratorInsideTheOutboxDecorator", func(t *testing.T) {
		t.Parallel()
		b, tr := setup(t, nil), newTraced(t)
		b.reg.SetTracer(tr.tracer)
		gc, sub := receive(t)
		// The order that lost the context on replay: the inner decorator
		// injects into what it sends, after the record was saved.
		pub, err := outbox.NewPublisher(b.reg, tracingPublisher{Publisher: gc, tracer: tr.app})
		require.NoError(t, err)

		ctx, root := tr.app.Start(context.Background(), "place order")
		msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
		msg.SetContext(ctx)
		require.NoError(t, pub.Publish(topic, msg))
		root.End()
		sent := next(t, sub)

		publish := tr.span(t, "outbox publish "+topic)
		inner := tr.named("app publish " + topic)
		require.Len(t, inner, 1)
		assert.Equal(t, root.SpanContext().SpanID(), publish.Parent.SpanID(), "the publish span is a child of the caller's span")
		assert.Equal(t, publish.SpanContext.SpanID(), inner[0].Parent.SpanID(), "the inner decorator's span is a child of the publish span")
		assert.Equal(t, trace.SpanKindProducer, publish.SpanKind)
		recs := b.pending(t)
		require.Len(t, recs, 1)
		assert.Equal(t, strconv.FormatInt(recs[0].ID, 10), attr(publish, string(outboxotel.AttrRecordID)))
		assert.Equal(t, "false", attr(publish, string(outboxotel.AttrTx)))
		saved := contextOf(recs[0].Metadata)
		assert.Equal(t, publish.SpanContext.TraceID(), saved.TraceID(), "the record keeps the trace")
		assert.Equal(t, publish.SpanContext.SpanID(), saved.SpanID(), "and the publish span, not the inner decorator's")
		assert.Equal(t, inner[0].SpanContext.SpanID(), contextOf(sent.Metadata).SpanID(), "what was sent carries the inner decorator's")

		// The replay sends under the outbox decorator, through the inner
		// decorator, and continues the saved trace.
		startCtx, startup := tr.app.Start(testContext(t), "startup")
		res, err := outbox.Replay(startCtx, b.reg, pub, outbox.ReplayConfig{}, nil)
		startup.End()
		require.NoError(t, err)
		require.Equal(t, 1, res.Total())
		next(t, sub)
		resend := tr.span(t, "outbox resend "+topic)
		assert.Equal(t, publish.SpanContext.TraceID(), resend.SpanContext.TraceID())
		assert.Equal(t, publish.SpanContext.SpanID(), resend.Parent.SpanID(), "the resend is a child of the saved publish span")
		require.Len(t, resend.Links, 1, "and links to the replay's own span")
		assert.Equal(t, startup.SpanContext(), resend.Links[0].SpanContext)
		assert.Equal(t, "replay", attr(resend, string(outboxotel.AttrResend)))
		assert.Equal(t, strconv.FormatInt(recs[0].ID, 10), attr(resend, string(outboxotel.AttrRecordID)))
		inner = tr.named("app publish " + topic)
		require.Len(t, inner, 2)
		assert.Equal(t, resend.SpanContext.SpanID(), inner[1].Parent.SpanID(), "the inner decorator's resend span is a child of the resend")
		assert.Len(t, b.pending(t), 1, "the replay saved no second record")
	})

	t.Run("TracingDecoratorOutsideTheOutboxDecorator", func(t *testing.T) {
		t.Parallel()
		b, tr := setup(t, nil), newTraced(t)
		b.reg.SetTracer(tr.tracer)
		gc, sub := receive(t)
		decorated, err := outbox.NewPublisher(b.reg, gc)
		require.NoError(t, err)
		// It puts its span into the metadata only, not into the context.
		pub := tracingPublisher{Publisher: decorated, tracer: tr.app}

		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("order"))))
		sent := next(t, sub)
		outer := tr.span(t, "app publish "+topic)
		publish := tr.span(t, "outbox publish "+topic)
		assert.Equal(t, outer.SpanContext.SpanID(), publish.Parent.SpanID(), "the publish span continues the trace the metadata carried")
		recs := b.pending(t)
		require.Len(t, recs, 1)
		assert.Equal(t, publish.SpanContext.SpanID(), contextOf(recs[0].Metadata).SpanID())
		assert.Equal(t, publish.SpanContext.SpanID(), contextOf(sent.Metadata).SpanID())

		res, err := outbox.Replay(testContext(t), b.reg, pub, outbox.ReplayConfig{}, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Total())
		assert.Len(t, b.pending(t), 1, "a replay through the outer decorator saves no second record")
		assert.Equal(t, publish.SpanContext.SpanID(), tr.span(t, "outbox resend "+topic).Parent.SpanID())
	})

	t.Run("TxPublisher", func(t *testing.T) {
		t.Parallel()
		b, tr := setup(t, nil), newTraced(t)
		b.reg.SetTracer(tr.tracer)
		gc, sub := receive(t)
		txPub, err := outbox.NewTxPublisher(b.reg, gc)
		require.NoError(t, err)

		ctx, root := tr.app.Start(testContext(t), "place order")
		tx, err := b.db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		ptx := txPub.Wrap(tx)
		msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
		msg.SetContext(ctx)
		require.NoError(t, ptx.Publish(ctx, topic, msg))
		require.NoError(t, ptx.Commit())
		root.End()
		sent := next(t, sub)

		publish := tr.span(t, "outbox publish "+topic)
		assert.Equal(t, "true", attr(publish, string(outboxotel.AttrTx)))
		assert.Equal(t, root.SpanContext().SpanID(), publish.Parent.SpanID())
		recs := b.pending(t)
		require.Len(t, recs, 1)
		assert.Equal(t, strconv.FormatInt(recs[0].ID, 10), attr(publish, string(outboxotel.AttrRecordID)))
		assert.Equal(t, publish.SpanContext.SpanID(), contextOf(recs[0].Metadata).SpanID(), "the transaction saved the trace context with the record")
		assert.Equal(t, publish.SpanContext.SpanID(), contextOf(sent.Metadata).SpanID())
		assert.Equal(t, ctx, msg.Context(), "the caller's message has its context back")
	})

	t.Run("FailedInsertIsAnErrorSpanWithoutRecordID", func(t *testing.T) {
		t.Parallel()
		db := sqliteBackend(t).Open(t)
		store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db})
		require.NoError(t, err)
		require.NoError(t, db.Close())
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store})
		require.NoError(t, err)
		tr := newTraced(t)
		reg.SetTracer(tr.tracer)
		pub, err := outbox.NewPublisher(reg, gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}))
		require.NoError(t, err)
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(outbox.MetadataID, "7") // a stale id of an earlier publish
		var insertErr *outbox.InsertError
		require.ErrorAs(t, pub.Publish(topic, msg), &insertErr)
		publish := tr.span(t, "outbox publish "+topic)
		assert.Equal(t, codes.Error, publish.Status.Code)
		assert.Empty(t, attr(publish, string(outboxotel.AttrRecordID)), "no record was saved")
	})
}

// handler is a handler that keeps the span context it ran in.
type handler struct {
	ran chan trace.SpanContext
}

func (h handler) handle(msg *message.Message) ([]*message.Message, error) {
	h.ran <- trace.SpanContextFromContext(msg.Context())
	return nil, nil
}

func TestDeliverySpans(t *testing.T) {
	t.Parallel()

	t.Run("CheckAndCompletionContinueTheMessagesTrace", func(t *testing.T) {
		t.Parallel()
		b, tr := setup(t, nil), newTraced(t)
		b.reg.SetTracer(tr.tracer)
		gc, sub := receive(t)
		pub, err := outbox.NewPublisher(b.reg, gc)
		require.NoError(t, err)
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), nil)))
		delivered := next(t, sub)

		mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{}, nil)
		require.NoError(t, err)
		h := handler{ran: make(chan trace.SpanContext, 2)}
		_, err = mw(h.handle)(delivered.Copy())
		require.NoError(t, err)
		_, err = mw(h.handle)(delivered.Copy())
		require.NoError(t, err)
		require.NoError(t, b.reg.WaitCompletions(t.Context()))

		publish := tr.span(t, "outbox publish "+topic)
		require.Len(t, h.ran, 1, "the copy was skipped")
		ran := <-h.ran
		assert.Equal(t, publish.SpanContext.TraceID(), ran.TraceID(), "the handler runs in the message's trace")
		assert.Equal(t, publish.SpanContext.SpanID(), ran.SpanID())
		checks := tr.named("outbox check " + topic)
		require.Len(t, checks, 2)
		for i, want := range []string{"pending", "duplicate"} {
			assert.Equal(t, publish.SpanContext.SpanID(), checks[i].Parent.SpanID())
			assert.Equal(t, want, attr(checks[i], string(outboxotel.AttrCheck)))
			assert.Equal(t, codes.Unset, checks[i].Status.Code)
		}
		complete := tr.span(t, "outbox complete "+topic)
		assert.Equal(t, publish.SpanContext.SpanID(), complete.Parent.SpanID())
		assert.Equal(t, attr(publish, string(outboxotel.AttrRecordID)), attr(complete, string(outboxotel.AttrRecordID)))
	})

	t.Run("AnOuterTracingMiddlewaresSpanIsContinued", func(t *testing.T) {
		t.Parallel()
		b, tr := setup(t, nil), newTraced(t)
		b.reg.SetTracer(tr.tracer)
		gc, sub := receive(t)
		pub, err := outbox.NewPublisher(b.reg, gc)
		require.NoError(t, err)
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), nil)))
		delivered := next(t, sub)

		mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{}, nil)
		require.NoError(t, err)
		ctx, process := tr.app.Start(context.Background(), "app process "+topic)
		delivered.SetContext(ctx)
		h := handler{ran: make(chan trace.SpanContext, 1)}
		_, err = mw(h.handle)(delivered)
		require.NoError(t, err)
		process.End()
		require.NoError(t, b.reg.WaitCompletions(t.Context()), "the completion runs in the background")
		assert.Equal(t, process.SpanContext(), <-h.ran)
		assert.Equal(t, process.SpanContext().SpanID(), tr.span(t, "outbox check "+topic).Parent.SpanID())
		assert.Equal(t, process.SpanContext().SpanID(), tr.span(t, "outbox complete "+topic).Parent.SpanID())
	})

	t.Run("FailedCheckIsAnErrorSpan", func(t *testing.T) {
		t.Parallel()
		b, tr := setup(t, nil), newTraced(t)
		b.reg.SetTracer(tr.tracer)
		gc, sub := receive(t)
		pub, err := outbox.NewPublisher(b.reg, gc)
		require.NoError(t, err)
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), nil)))
		delivered := next(t, sub)
		_, err = b.store.Identity(testContext(t)) // cached: the check below is what fails
		require.NoError(t, err)
		require.NoError(t, b.db.Close())

		mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{}, nil)
		require.NoError(t, err)
		h := handler{ran: make(chan trace.SpanContext, 1)}
		_, err = mw(h.handle)(delivered)
		var fetchErr *outbox.CheckError
		require.ErrorAs(t, err, &fetchErr)
		check := tr.span(t, "outbox check "+topic)
		assert.Equal(t, "refused", attr(check, string(outboxotel.AttrCheck)))
		assert.Equal(t, codes.Error, check.Status.Code)
		assert.Empty(t, h.ran)
	})
}

func TestUntrackedMessagesPassThroughUnchanged(t *testing.T) {
	t.Parallel()
	b, tr := setup(t, nil), newTraced(t)
	b.reg.SetTracer(tr.tracer)
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	sub, err := gc.Subscribe(testContext(t), "audit")
	require.NoError(t, err)
	pub, err := outbox.NewPublisher(b.reg, gc)
	require.NoError(t, err)

	ctx, root := tr.app.Start(context.Background(), "audit")
	msg := message.NewMessage(watermill.NewUUID(), []byte("entry"))
	msg.Metadata.Set("k", "v")
	msg.SetContext(ctx)
	before := maps.Clone(msg.Metadata)
	require.NoError(t, pub.Publish("audit", msg))
	root.End()
	got := <-sub
	got.Ack()
	assert.Equal(t, before, msg.Metadata, "the untracked publish added nothing")
	assert.Equal(t, before, got.Metadata)
	assert.Equal(t, ctx, msg.Context())

	mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{}, nil)
	require.NoError(t, err)
	var seen context.Context
	delivered := got.Copy()
	_, err = mw(func(m *message.Message) ([]*message.Message, error) {
		seen = m.Context()
		return nil, nil
	})(delivered)
	require.NoError(t, err)
	assert.Equal(t, delivered.Context(), seen, "the handler of a message without outbox metadata runs in its own context")
	assert.Equal(t, []string{"audit"}, spanNames(tr), "the outbox started no span")
}

func spanNames(tr *traced) []string {
	var names []string
	for _, s := range tr.exporter.GetSpans() {
		names = append(names, s.Name)
	}
	return names
}
