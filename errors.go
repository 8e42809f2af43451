package outbox

import (
	"errors"
	"fmt"

	"github.com/wmoutbox/outbox/recordstore"
)

var (
	// ErrNotPending is returned by [CompleteTx] when another copy of the
	// message completed the record first.
	ErrNotPending = recordstore.ErrNotPending

	// ErrAlreadyHandled is returned by [InboxTx] when the consumer has
	// already handled the message: ack and do nothing.
	ErrAlreadyHandled = recordstore.ErrAlreadyHandled

	// ErrNotSupported is wrapped when a store lacks an optional operation a
	// call needs, such as InsertTx for [TxPublisher] or CompleteTx for
	// [CompleteTx].
	ErrNotSupported = recordstore.ErrNotSupported

	// ErrInvalidMetadata is wrapped by the error logged for a message of
	// this service's table whose record id cannot be read; its handler
	// runs once, untracked.
	ErrInvalidMetadata = errors.New("outbox: invalid outbox metadata")

	// ErrInvalidConfig is wrapped by every configuration error, of the
	// outbox and of its stores.
	ErrInvalidConfig = recordstore.ErrInvalidConfig

	// ErrDropped marks a handler error that discards the message: the record
	// is completed as if the handler had succeeded. Build one with [Drop].
	ErrDropped = errors.New("outbox: message dropped")

	// ErrOutcomeUnknown is matched by an [*InsertError] whose records may
	// have been saved (the answer to the statement or its commit was lost).
	ErrOutcomeUnknown = recordstore.ErrOutcomeUnknown

	// ErrInboxTxNotCommitted is wrapped by the error of a handler that
	// saved its inbox entry with [InboxTx] and returned nil while the entry
	// did not commit: a failed attempt.
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

// CheckError is returned by the middleware (a nack, the handler not run)
// when the record of a delivered message could not be checked, or another
// delivery holds its lease (Err wraps [recordstore.ErrLeased]).
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

// VerifyError is returned by [Replay] (aborting [ReplayPlugin]'s start)
// when a store reports that it is not ready ([recordstore.Verifier]);
// nothing was replayed. Topic is the store's first tracked topic.
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

// AbandonedError is returned by the middleware when a handler failed for
// the last allowed time ([MiddlewareConfig.MaxAttempts]): the record is
// kept, no longer pending, and Err is the handler's error. A
// PoisonQueueWithFilter(pub, topic, [IsAbandoned]) outside the middleware
// diverts the message.
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

type dropError struct{ err error }

func (d dropError) Error() string {
	if d.err == nil {
		return ErrDropped.Error()
	}
	return ErrDropped.Error() + ": " + d.err.Error()
}

func (d dropError) Unwrap() []error { return []error{ErrDropped, d.err} }

// Drop wraps a handler error to say the message is to be discarded: the
// middleware completes its record (it is never delivered again) and
// acknowledges the message. errors.Is(Drop(err), err) and
// errors.Is(Drop(err), ErrDropped) both hold; err may be nil.
// A PoisonQueueWithFilter(pub, topic, [IsDrop]) inside the outbox
// middleware diverts dropped messages instead.
func Drop(err error) error { return dropError{err: err} }

// IsDrop reports whether err was built with [Drop].
func IsDrop(err error) bool { return errors.Is(err, ErrDropped) }
