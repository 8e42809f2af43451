package observe

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Tracer follows tracked messages through the outbox with their contexts,
// for distributed tracing: the outboxotel package implements it with
// OpenTelemetry, without the outbox depending on it. Set it with
// [outbox.Registry.SetTracer].
//
// Its methods are called on the tracked paths only (never for messages
// without outbox metadata, nor for those this service does not own), from
// many goroutines at once. Each step's method returns the function the
// outbox calls when the step ends, with the step's outcome; it may return
// nil.
type Tracer interface {
	// TracePublish is called when tracked messages are published through
	// the publisher ([outbox.NewPublisher], [outbox.PublisherDecorator]) or a
	// [outbox.TxPublisher] (inTx), before their records are saved: metadata it
	// adds to a message, such as a trace context, is saved with the record
	// and sent with the message and with every resend. It may set the
	// messages' contexts for the save and the send, and restore them when
	// the step ends.
	//
	// The step ends once the messages were sent or the publish failed; in
	// a transaction, once the records were saved in it (the send, after
	// the commit, is not part of it). From the save on, each message
	// carries its record id ([outbox.MetadataID]); the error is an [*outbox.InsertError]
	// when nothing was saved.
	TracePublish(topic string, msgs []*message.Message, inTx bool) (end func(error))

	// TraceResend is called before saved records are sent again, with the
	// messages built from them: their saved metadata, the outbox keys and
	// a context that keeps the sender's values (the context given to
	// [outbox.Replay], [outbox.StaleResubmitter.ResubmitOnce] or [outboxops.Requeue]). It may
	// change their metadata and contexts before the send. The step ends
	// once the messages were sent, or the send failed.
	TraceResend(kind ResendKind, topic string, msgs []*message.Message) (end func(error))

	// TraceDelivery is called when the middleware takes a delivery of this
	// service's record for its consumer, before it checks the record. The
	// context it returns (derived from ctx, the message's) is the
	// delivery's: the check starts from it, the handler sees it as
	// msg.Context(), and the completion starts from it.
	TraceDelivery(ctx context.Context, msg *message.Message, ref RecordRef) context.Context

	// TraceCheck is called before the middleware checks the record of a
	// delivery, with the delivery's context. The check runs in the context
	// it returns, under [outbox.MiddlewareConfig.Check.Timeout]; the step ends
	// with the check's outcome, and the error that made it refuse the
	// delivery, if any.
	TraceCheck(ctx context.Context, ref RecordRef) (context.Context, func(CheckOutcome, error))

	// TraceComplete is called before the middleware completes a delivery
	// whose handler succeeded or dropped the message, with the delivery's
	// context. The completion runs in the context it returns, without its
	// cancellation and under [outbox.MiddlewareConfig.Complete.Timeout]; the step
	// ends with the completion's error: nil, [outbox.ErrNotPending] when another
	// copy completed it first, or the store's failure (the record then
	// stays pending).
	TraceComplete(ctx context.Context, ref RecordRef) (context.Context, func(error))
}

// ResendKind says which sender sends a saved record again.
type ResendKind string

// The senders of saved records.
const (
	// ResendReplay is the startup replay ([outbox.Replay], [outbox.ReplayPlugin]).
	ResendReplay ResendKind = "replay"
	// ResendResubmit is the [outbox.StaleResubmitter].
	ResendResubmit ResendKind = "resubmit"
	// ResendRequeue is [outboxops.Requeue], of an abandoned record.
	ResendRequeue ResendKind = "requeue"
)

// CheckOutcome is what the middleware's check decided for a delivery.
type CheckOutcome string

// The outcomes of the check.
const (
	// CheckPending: the record is pending for the consumer; the handler
	// runs.
	CheckPending CheckOutcome = "pending"
	// CheckDuplicate: the consumer already completed the record; the copy
	// is acknowledged without running the handler.
	CheckDuplicate CheckOutcome = "duplicate"
	// CheckUnknown: the table has no such record; the message is
	// acknowledged without running the handler.
	CheckUnknown CheckOutcome = "unknown"
	// CheckMismatch: the record was saved for another message than the
	// delivered one (another UUID), or the store cannot keep a value of
	// the delivery (recordstore.ErrInvalidValue); the message is
	// acknowledged without running the handler and the record is left as
	// it was.
	CheckMismatch CheckOutcome = "mismatch"
	// CheckUntracked: the record is not this consumer's (completed by
	// another handler of an undeclared topic, or saved before the
	// consumer was declared); the handler runs untracked.
	CheckUntracked CheckOutcome = "untracked"
	// CheckRefused: the check failed, or the record is leased by another
	// delivery or not due yet; the delivery is nacked without running the
	// handler.
	CheckRefused CheckOutcome = "refused"
)

// RecordRef identifies the record of a message being handled, and the
// consumer handling it.
type RecordRef struct {
	Topic    string
	ID       int64
	Consumer string
}
