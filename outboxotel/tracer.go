package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/observe"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/wmoutbox/outbox/outboxotel"

// Span attributes the outbox sets, beside the messaging conventions'
// messaging.destination.name (the tracked topic), messaging.message.id (the
// message UUID) and messaging.operation.type.
const (
	// AttrRecordID is the record id, the value of the [outbox.MetadataID]
	// metadata key.
	AttrRecordID = attribute.Key("outbox.id")
	// AttrResend says which sender sent a saved record again:
	// replay, resubmit or requeue ([observe.ResendKind]).
	AttrResend = attribute.Key("outbox.resend")
	// AttrTx is true on the publish span of a [outbox.TxPublisher].
	AttrTx = attribute.Key("outbox.tx")
	// AttrConsumer is the consumer (the handler name) of a delivery.
	AttrConsumer = attribute.Key("outbox.consumer")
	// AttrCheck is the outcome of the middleware's check
	// ([observe.CheckOutcome]).
	AttrCheck = attribute.Key("outbox.check")
)

// EventAlreadyCompleted is the event on a completion span whose record
// another copy completed first; it is not an error.
const EventAlreadyCompleted = "outbox.already_completed"

// TracerConfig configures [NewTracer].
type TracerConfig struct {
	// TracerProvider provides the tracer of the spans. Defaults to
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator injects the trace context into the message metadata, to
	// be saved with the record and sent, and extracts it from delivered
	// and resent messages. It must propagate something:
	// propagation.TraceContext{} (W3C traceparent and tracestate), usually
	// in a composite with propagation.Baggage{}. Defaults to
	// otel.GetTextMapPropagator(), which propagates nothing until the
	// application sets one with otel.SetTextMapPropagator.
	Propagator propagation.TextMapPropagator
}

func (c *TracerConfig) setDefaults() {
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
}

// Validate reports a configuration error, if any.
func (c TracerConfig) Validate() error {
	if c.TracerProvider == nil {
		return fmt.Errorf("%w: TracerProvider is nil", outbox.ErrInvalidConfig)
	}
	if c.Propagator == nil || len(c.Propagator.Fields()) == 0 {
		return fmt.Errorf("%w: the propagator propagates nothing, so no trace context would be saved with the records; "+
			"set TracerConfig.Propagator, or otel.SetTextMapPropagator(propagation.TraceContext{}) before NewTracer", outbox.ErrInvalidConfig)
	}
	return nil
}

// Tracer is an [observe.Tracer] that records the outbox's steps as
// OpenTelemetry spans and carries the trace context with each record; see
// the package documentation. Give it to the registry with
// [outbox.Registry.SetTracer]. Safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

var _ observe.Tracer = (*Tracer)(nil)

// NewTracer returns a tracer. It does not attach itself: call
// reg.SetTracer(t).
func NewTracer(cfg TracerConfig) (*Tracer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Tracer{tracer: cfg.TracerProvider.Tracer(ScopeName), prop: cfg.Propagator}, nil
}

// carrier is the message metadata as a propagation carrier, created when
// the message has none.
func carrier(msg *message.Message) propagation.MapCarrier {
	if msg.Metadata == nil {
		msg.Metadata = make(message.Metadata, 2)
	}
	return propagation.MapCarrier(msg.Metadata)
}

// TracePublish implements [observe.Tracer]: it starts a producer span per
// message, a child of the message context's span, or of the trace context
// already in its metadata (a tracing decorator outside the outbox one put it
// there), and injects the span's context into the metadata before the
// record is saved. The save and the send run in the span's context; the
// messages get their own contexts back when the step ends.
func (t *Tracer) TracePublish(topic string, msgs []*message.Message, inTx bool) func(error) {
	spans := make([]trace.Span, len(msgs))
	saved := make([]context.Context, len(msgs))
	for i, msg := range msgs {
		saved[i] = msg.Context()
		parent := saved[i]
		if !trace.SpanContextFromContext(parent).IsValid() {
			parent = t.prop.Extract(parent, carrier(msg))
		}
		ctx, span := t.tracer.Start(parent, "outbox publish "+topic,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				semconv.MessagingDestinationName(topic),
				semconv.MessagingMessageID(msg.UUID),
				semconv.MessagingOperationTypeSend,
				AttrTx.Bool(inTx),
			))
		t.prop.Inject(ctx, carrier(msg))
		msg.SetContext(ctx)
		spans[i] = span
	}
	return func(err error) {
		var insertErr *outbox.InsertError
		saveFailed := errors.As(err, &insertErr)
		for i, msg := range msgs {
			span := spans[i]
			if !saveFailed {
				setRecordID(span, msg)
			}
			endSpan(span, err)
			msg.SetContext(saved[i])
		}
	}
}

// TraceResend implements [observe.Tracer]: it starts a producer span per
// message that continues the trace saved with the record (a child of the
// publish span), linked to the sender's own span when its context has one,
// and injects it into the message sent, so that the receiver continues
// from the resend. A record saved without a trace context gets a span in
// the sender's context.
func (t *Tracer) TraceResend(kind observe.ResendKind, topic string, msgs []*message.Message) func(error) {
	spans := make([]trace.Span, len(msgs))
	for i, msg := range msgs {
		sender := msg.Context()
		parent := t.prop.Extract(sender, carrier(msg))
		opts := []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				semconv.MessagingDestinationName(topic),
				semconv.MessagingMessageID(msg.UUID),
				semconv.MessagingOperationTypeSend,
				AttrResend.String(string(kind)),
			),
		}
		senderSpan := trace.SpanContextFromContext(sender)
		if senderSpan.IsValid() && !senderSpan.Equal(trace.SpanContextFromContext(parent)) {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: senderSpan}))
		}
		ctx, span := t.tracer.Start(parent, "outbox resend "+topic, opts...)
		setRecordID(span, msg)
		t.prop.Inject(ctx, carrier(msg))
		msg.SetContext(ctx)
		spans[i] = span
	}
	return func(err error) {
		for _, span := range spans {
			endSpan(span, err)
		}
	}
}

// TraceDelivery implements [observe.Tracer]: the delivery continues the
// span of the message's context when a tracing middleware outside the
// outbox one started it, and otherwise the trace context the message
// carries (of the publish, or of the resend).
func (t *Tracer) TraceDelivery(ctx context.Context, msg *message.Message, _ outbox.RecordRef) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	return t.prop.Extract(ctx, propagation.MapCarrier(msg.Metadata))
}

// TraceCheck implements [observe.Tracer] with a span for the check, whose
// [AttrCheck] attribute is its outcome; a refusal with an error (the
// database failed or timed out) is an error.
func (t *Tracer) TraceCheck(ctx context.Context, ref outbox.RecordRef) (context.Context, func(observe.CheckOutcome, error)) {
	ctx, span := t.tracer.Start(ctx, "outbox check "+ref.Topic, deliveryAttrs(ref))
	return ctx, func(o observe.CheckOutcome, err error) {
		span.SetAttributes(AttrCheck.String(string(o)))
		endSpan(span, err)
	}
}

// TraceComplete implements [observe.Tracer] with a span for the completion.
// A record another copy completed first gets [EventAlreadyCompleted]; a
// failed completion is an error (the record stays pending).
func (t *Tracer) TraceComplete(ctx context.Context, ref outbox.RecordRef) (context.Context, func(error)) {
	ctx, span := t.tracer.Start(ctx, "outbox complete "+ref.Topic, deliveryAttrs(ref), trace.WithAttributes(semconv.MessagingOperationTypeSettle))
	return ctx, func(err error) {
		if errors.Is(err, outbox.ErrNotPending) {
			span.AddEvent(EventAlreadyCompleted)
			err = nil
		}
		endSpan(span, err)
	}
}

func deliveryAttrs(ref outbox.RecordRef) trace.SpanStartEventOption {
	return trace.WithAttributes(
		semconv.MessagingDestinationName(ref.Topic),
		AttrRecordID.Int64(ref.ID),
		AttrConsumer.String(ref.Consumer),
	)
}

// setRecordID sets the record id the message carries, if it is one.
func setRecordID(span trace.Span, msg *message.Message) {
	if id, err := strconv.ParseInt(msg.Metadata[outbox.MetadataID], 10, 64); err == nil {
		span.SetAttributes(AttrRecordID.Int64(id))
	}
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
