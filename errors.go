package outbox

import (
	"errors"
	"fmt"

	"github.com/wmoutbox/outbox/recordstore"
)

var (
	// ErrNotPending is returned by [CompleteTx] when another copy of the
	// message completed the record first. It is the store's sentinel.
	ErrNotPending = recordstore.ErrNotPending

	// ErrAlreadyHandled is returned by [InboxTx] when the consumer has
	// already handled the message (another copy, or an operation with the
	// same business key): the handler must ack and do nothing. It is the
	// inbox's sentinel.
	ErrAlreadyHandled = recordstore.ErrAlreadyHandled

	// ErrNotSupported is wrapped when a store lacks an optional operation a
	// call needs, such as InsertTx for [TxPublisher] or CompleteTx for
	// [CompleteTx].
	ErrNotSupported = recordstore.ErrNotSupported

	// ErrInvalidMetadata is wrapped by the error logged for a delivered
	// message of this service's table whose record id cannot be read (not
	// a positive decimal integer). Nacking it would bring it back without
	// end, and it has no record to complete, so the middleware logs the
	// error and runs the handler once, untracked, in every middleware
	// order.
	ErrInvalidMetadata = errors.New("outbox: invalid outbox metadata")

	// ErrInvalidConfig is wrapped by every configuration error, of the
	// outbox and of its stores.
	ErrInvalidConfig = recordstore.ErrInvalidConfig

	// ErrDropped marks a handler error that discards the message: the record
	// is completed as if the handler had succeeded. Build one with [Drop].
	ErrDropped = errors.New("outbox: message dropped")

	// ErrOutcomeUnknown is matched by an [*InsertError] whose records may
	// have been saved: the connection was lost, or the insert's deadline
	// passed, after the statement or its commit was sent. It is the store's
	// sentinel.
	ErrOutcomeUnknown = recordstore.ErrOutcomeUnknown

	// ErrInboxTxNotCommitted is wrapped by the error of a handler of
	// another service's message that saved its inbox entry with [InboxTx]
	// and returned nil, while the entry did not commit (its transaction
	// rolled back, or was never committed): the message counts as not
	// handled, its delivery as a failed attempt.
	ErrInboxTxNotCommitted = errors.New("outbox: the InboxTx transaction did not commit")

	// ErrTxDone is returned by a [PublishingTx] that was already committed
	// or rolled back.
	ErrTxDone = errors.New("outbox: transaction already committed or rolled back")
)

// InsertError is returned by the publisher decorator when the records of a
// Publish call could not be saved. Nothing was sent. No record was saved
// either, unless OutcomeUnknown is set (errors.Is(err, [ErrOutcomeUnknown])
// matches then): the records may have been saved, and if they were the next
// replay sends them, so publishing them again may deliver them twice.
type InsertError struct {
	Topic string
	Count int
	// OutcomeUnknown is set when the connection was lost, or the insert's
	// deadline passed, while the statement or its commit was on its way:
	// the store cannot tell whether the records were saved.
	OutcomeUnknown bool
	Err            error
}

// Error implements error.
func (e *InsertError) Error() string {
	if e.OutcomeUnknown {
		return fmt.Sprintf("outbox: saving %d record(s) for topic %q got no answer, nothing was sent, but the records may have been saved and then the next replay sends them: %v", e.Count, e.Topic, e.Err)
	}
	return fmt.Sprintf("outbox: saving %d record(s) for topic %q failed, nothing was saved or sent: %v", e.Count, e.Topic, e.Err)
}

// Unwrap returns the cause, for errors.Is and errors.As.
func (e *InsertError) Unwrap() error { return e.Err }

// SendError is returned by the publisher decorator when the records were saved
// but the wrapped publisher failed. The records stay pending and the next
// replay sends them.
type SendError struct {
	Topic string
	IDs   []int64
	Err   error
}

// Error implements error.
func (e *SendError) Error() string {
	return fmt.Sprintf("outbox: sending %d message(s) to topic %q failed, records %v stay pending for replay: %v", len(e.IDs), e.Topic, e.IDs, e.Err)
}

// Unwrap returns the cause, for errors.Is and errors.As.
func (e *SendError) Unwrap() error { return e.Err }

// CheckError is returned by the middleware when the record of a delivered
// message could not be checked: the check failed or ran out of
// [MiddlewareConfig.CheckTimeout], or another delivery holds the record's
// lease (Err wraps [recordstore.ErrLeased]). The handler was not run and the
// message is nacked so that the broker redelivers it. A copy whose next
// attempt is not due yet is no error: the middleware holds it, nacks it
// itself and returns nil.
type CheckError struct {
	Topic string
	ID    int64
	Err   error
}

// Error implements error.
func (e *CheckError) Error() string {
	return fmt.Sprintf("outbox: checking record %d of %q failed, message nacked: %v", e.ID, e.Topic, e.Err)
}

// Unwrap returns the cause, for errors.Is and errors.As.
func (e *CheckError) Unwrap() error { return e.Err }

// ConfirmError is returned by the middleware (a nack) when the
// confirmation of another service's message could not be published: the
// handler ran, and the next copy of the message confirms again.
type ConfirmError struct {
	Topic    string
	ID       int64
	Consumer string
	Err      error
}

// Error implements error.
func (e *ConfirmError) Error() string {
	return fmt.Sprintf("outbox: confirming record %d of %q for consumer %q failed, message nacked: %v", e.ID, e.Topic, e.Consumer, e.Err)
}

// Unwrap returns the cause, for errors.Is and errors.As.
func (e *ConfirmError) Unwrap() error { return e.Err }

// ResendError is returned by [Replay] and aborts the router started with
// [ReplayPlugin] when a pending record could not be read or sent. For a send
// failure ID is the first record of the batch that failed; for a read failure
// ID is zero and AfterID is the last record replayed before it (zero if none).
type ResendError struct {
	Topic   string
	ID      int64
	AfterID int64
	Err     error
}

// Error implements error.
func (e *ResendError) Error() string {
	if e.ID == 0 {
		return fmt.Sprintf("outbox: replay of %q failed reading the pending records after record %d: %v", e.Topic, e.AfterID, e.Err)
	}
	return fmt.Sprintf("outbox: replay of %q failed at record %d: %v", e.Topic, e.ID, e.Err)
}

// Unwrap returns the cause, for errors.Is and errors.As.
func (e *ResendError) Unwrap() error { return e.Err }

// VerifyError is returned by [Replay], and aborts the router started with
// [ReplayPlugin], when a store that implements [recordstore.Verifier]
// reports that it is not ready (its table is missing, or at another schema
// version). Nothing was replayed. Topic is the first tracked topic, in
// sorted order, that uses the store.
type VerifyError struct {
	Topic string
	Err   error
}

// Error implements error.
func (e *VerifyError) Error() string {
	return fmt.Sprintf("outbox: the store of %q is not ready, nothing was replayed: %v", e.Topic, e.Err)
}

// Unwrap returns the cause, for errors.Is and errors.As.
func (e *VerifyError) Unwrap() error { return e.Err }

// AbandonedError is returned by the middleware when a handler failed for the
// last allowed time ([MiddlewareConfig.MaxAttempts]) and the record was
// abandoned: it is kept, visible and no longer pending, so it is never
// replayed and a redelivered copy is acknowledged without handling. Err is
// the handler's error. Put Watermill's PoisonQueueWithFilter(pub, topic,
// outbox.IsAbandoned) outside the outbox middleware to divert the message.
type AbandonedError struct {
	Topic    string
	ID       int64
	Attempts int
	Err      error
}

// Error implements error.
func (e *AbandonedError) Error() string {
	return fmt.Sprintf("outbox: record %d of %q abandoned after %d failed attempt(s): %v", e.ID, e.Topic, e.Attempts, e.Err)
}

// Unwrap returns the cause, for errors.Is and errors.As.
func (e *AbandonedError) Unwrap() error { return e.Err }

// IsAbandoned reports whether err is, or wraps, an [*AbandonedError].
func IsAbandoned(err error) bool {
	var a *AbandonedError
	return errors.As(err, &a)
}
