package outbox

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrNotPending is returned by a [Store] when a record is not pending:
	// it was completed, deleted or never existed.
	ErrNotPending = errors.New("outbox: record is not pending")

	// ErrInvalidMetadata is wrapped by the error logged for a delivered
	// message of this service's table whose record id cannot be read (not
	// a positive decimal integer). Nacking it would bring it back without
	// end, and it has no record to complete, so the middleware logs the
	// error and runs the handler once, untracked, in every middleware
	// order.
	ErrInvalidMetadata = errors.New("outbox: invalid outbox metadata")

	// ErrInvalidConfig is wrapped by every configuration error.
	ErrInvalidConfig = errors.New("outbox: invalid configuration")

	// ErrDropped marks a handler error that discards the message: the record
	// is completed as if the handler had succeeded. Build one with [Drop].
	ErrDropped = errors.New("outbox: message dropped")

	// ErrNotSupported is wrapped when a [Store] lacks an optional operation a
	// call needs, such as [TxInserter] for [TxPublisher] or [TxCompleter]
	// for [CompleteTx].
	ErrNotSupported = errors.New("outbox: not supported by the store")

	// ErrLeased is returned by the CheckPending of a store with a delivery
	// lease when another delivery holds the record's lease: the handler may
	// be running elsewhere right now. The middleware nacks the message
	// without running the handler, so the broker redelivers it later.
	ErrLeased = errors.New("outbox: record is leased by another delivery")

	// ErrUnknownRecord is wrapped by the CheckPending of a [Store] that
	// keeps completed records when no record has the delivery's id and
	// topic: the id was never saved in this table under this topic, or its
	// record was cleaned up. The middleware acknowledges the message
	// without running the handler and logs a warning.
	ErrUnknownRecord = errors.New("outbox: no record with this id and topic")
	// ErrNoDelivery is wrapped by the CheckPending of a [Store] when the
	// record declares its consumers and the delivery's consumer is not one
	// of them (the record was saved before the consumer was declared). The
	// middleware runs the handler untracked.
	ErrNoDelivery = errors.New("outbox: the record has no delivery for this consumer")
	// ErrCompletedByOther is wrapped by [*ConsumerConflictError].
	ErrCompletedByOther = errors.New("outbox: record completed by another consumer")
	// ErrNotDue is wrapped by [*NotDueError].
	ErrNotDue = errors.New("outbox: the record's next attempt is not due yet")
	// ErrTxDone is returned by a [PublishingTx] that was already committed
	// or rolled back.
	ErrTxDone = errors.New("outbox: transaction already committed or rolled back")
)

// InsertError is returned by the publisher decorator when the records of a
// Publish call could not be saved. Nothing was sent.
type InsertError struct {
	Topic string
	Count int
	Err   error
}

func (e *InsertError) Error() string {
	return fmt.Sprintf("outbox: saving %d record(s) for topic %q failed, nothing was sent: %v", e.Count, e.Topic, e.Err)
}

func (e *InsertError) Unwrap() error { return e.Err }

// SendError is returned by the publisher decorator when the records were saved
// but the wrapped publisher failed. The records stay pending and the next
// replay sends them.
type SendError struct {
	Topic string
	IDs   []int64
	Err   error
}

func (e *SendError) Error() string {
	return fmt.Sprintf("outbox: sending %d message(s) to topic %q failed, records %v stay pending for replay: %v", len(e.IDs), e.Topic, e.IDs, e.Err)
}

func (e *SendError) Unwrap() error { return e.Err }

// FetchError is returned by the middleware when the record of a delivered
// message could not be read. The handler was not run and the message is
// nacked so that the broker redelivers it.
type FetchError struct {
	Name string
	ID   int64
	Err  error
}

func (e *FetchError) Error() string {
	return fmt.Sprintf("outbox: checking record %d of %q failed, message nacked: %v", e.ID, e.Name, e.Err)
}

func (e *FetchError) Unwrap() error { return e.Err }

// LeasedError is returned by the middleware when another delivery holds the
// lease of the record (see [ErrLeased]). The handler was not run and the
// message is nacked so that the broker redelivers it later.
type LeasedError struct {
	Name string
	ID   int64
	Err  error
}

func (e *LeasedError) Error() string {
	return fmt.Sprintf("outbox: record %d of %q is being handled by another delivery, message nacked: %v", e.ID, e.Name, e.Err)
}

func (e *LeasedError) Unwrap() error { return e.Err }

// ConsumerConflictError is returned by the CheckPending of a [Store] when a
// record whose topic declares no consumers was completed by another
// consumer: two handlers receive the topic, and the copy is not a duplicate
// for this one. The middleware runs the handler untracked and logs the
// conflict; declare the consumers ([Tracked.Consumers]) to track each.
type ConsumerConflictError struct {
	ID          int64
	Consumer    string
	CompletedBy string
}

func (e *ConsumerConflictError) Error() string {
	return fmt.Sprintf("outbox: record %d was completed by consumer %q, not by %q", e.ID, e.CompletedBy, e.Consumer)
}

func (e *ConsumerConflictError) Unwrap() error { return ErrCompletedByOther }

// NotDueError is returned by the CheckPending of a [Store] when the
// delivery failed before and its next attempt is not due for Wait, by the
// database clock. The middleware holds such a copy and nacks it without
// running the handler, so that a broker that redelivers at once does not
// run a failing handler in a tight loop.
type NotDueError struct {
	ID   int64
	Wait time.Duration
}

func (e *NotDueError) Error() string {
	return fmt.Sprintf("outbox: record %d is due again in %v", e.ID, e.Wait)
}

func (e *NotDueError) Unwrap() error { return ErrNotDue }

// ReplayError is returned by [Replay] and aborts the router started with
// [ReplayPlugin] when a pending record could not be read or sent. For a send
// failure ID is the first record of the batch that failed; for a read failure
// ID is zero and AfterID is the last record replayed before it (zero if none).
type ReplayError struct {
	Name    string
	ID      int64
	AfterID int64
	Err     error
}

func (e *ReplayError) Error() string {
	if e.ID == 0 {
		return fmt.Sprintf("outbox: replay of %q failed reading the pending records after record %d: %v", e.Name, e.AfterID, e.Err)
	}
	return fmt.Sprintf("outbox: replay of %q failed at record %d: %v", e.Name, e.ID, e.Err)
}

func (e *ReplayError) Unwrap() error { return e.Err }

// VerifyError is returned by [Replay], and aborts the router started with
// [ReplayPlugin], when a store that implements [Verifier] reports that it is
// not ready (its table is missing, or at another schema version). Nothing was
// replayed. Name is the first tracked name, in sorted order, that uses the
// store.
type VerifyError struct {
	Name string
	Err  error
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("outbox: the store of %q is not ready, nothing was replayed: %v", e.Name, e.Err)
}

func (e *VerifyError) Unwrap() error { return e.Err }

// ErrNotAbandoned is returned by a [Resubmitter] asked to resubmit a record
// that is not abandoned (pending, completed or missing).
var ErrNotAbandoned = errors.New("outbox: record is not abandoned")

// AbandonedError is returned by the middleware when a handler failed for the
// last allowed time ([MiddlewareConfig.MaxAttempts]) and the record was
// abandoned: it is kept, visible and no longer pending, so it is never
// replayed and a redelivered copy is acknowledged without handling. Err is
// the handler's error. Put Watermill's PoisonQueueWithFilter(pub, topic,
// outbox.IsAbandoned) outside the outbox middleware to divert the message.
type AbandonedError struct {
	Name     string
	ID       int64
	Attempts int
	Err      error
}

func (e *AbandonedError) Error() string {
	return fmt.Sprintf("outbox: record %d of %q abandoned after %d failed attempt(s): %v", e.ID, e.Name, e.Attempts, e.Err)
}

func (e *AbandonedError) Unwrap() error { return e.Err }

// IsAbandoned reports whether err is, or wraps, an [*AbandonedError].
func IsAbandoned(err error) bool {
	var a *AbandonedError
	return errors.As(err, &a)
}
