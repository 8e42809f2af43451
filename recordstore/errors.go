package recordstore

import (
	"errors"
	"fmt"
	"time"
)

// The sentinels a [Store] returns; their contract is written on the methods
// that return them.
var (
	// ErrNotPending is returned when a delivery is not pending: its
	// consumer completed it, it was abandoned, or (on a table that deletes
	// completed records) it is gone.
	ErrNotPending = errors.New("outbox: record is not pending")

	// ErrLeased is returned by the CheckPending of a store with a delivery
	// lease when another delivery holds the record's lease: the handler may
	// be running elsewhere right now.
	ErrLeased = errors.New("outbox: record is leased by another delivery")

	// ErrUnknownRecord is wrapped by the CheckPending of a store that keeps
	// completed records when no record has the delivery's id and topic: the
	// id was never saved in this table under this topic, or its record was
	// cleaned up.
	ErrUnknownRecord = errors.New("outbox: no record with this id and topic")

	// ErrNoDelivery is wrapped by CheckPending when the record declares its
	// consumers and the delivery's consumer is not one of them (the record
	// was saved before the consumer was declared).
	ErrNoDelivery = errors.New("outbox: the record has no delivery for this consumer")

	// ErrMessageMismatch is wrapped by CheckPending when the record with
	// the delivery's id and topic was saved for another message
	// ([Delivery.UUID]): the delivered message is not the record's, and
	// nothing is changed. (Complete reports such a delivery as
	// ErrNotPending, changing nothing.)
	ErrMessageMismatch = errors.New("outbox: the message is not the record's")

	// ErrAlreadyHandled is returned by an [Inbox] when the consumer has
	// already handled the entry's message, or an operation with its
	// business key.
	ErrAlreadyHandled = errors.New("outbox: message already handled by this consumer")

	// ErrInvalidEntry is wrapped by an [Inbox] given an [InboxEntry] it
	// cannot keep: without a Consumer or a MessageUUID, or, in a store
	// with limits, with a field longer than it allows. Nothing is saved.
	ErrInvalidEntry = errors.New("outbox: invalid inbox entry")

	// ErrInvalidValue is wrapped when a store cannot keep or compare a
	// value of a call (a NUL byte or invalid UTF-8 where its database
	// keeps text, a name longer than its column): the data is bad, not
	// the database, and no retry of the call makes it good. A [Store]
	// refuses it before sending anything where it knows its database's
	// rules, and wraps it in the database's own refusal otherwise.
	ErrInvalidValue = errors.New("outbox: a value the store cannot keep")

	// ErrCompletedByOther is wrapped by [*ConsumerConflictError].
	ErrCompletedByOther = errors.New("outbox: record completed by another consumer")

	// ErrHeld is wrapped by [*HeldError].
	ErrHeld = errors.New("outbox: an earlier record of the key is not complete")

	// ErrNotDue is wrapped by [*NotDueError].
	ErrNotDue = errors.New("outbox: the record's next attempt is not due yet")

	// ErrNotAbandoned is returned by a [Requeuer] asked to requeue a record
	// that is not abandoned (pending, completed or missing).
	ErrNotAbandoned = errors.New("outbox: record is not abandoned")

	// ErrConsumerDeclared is wrapped by [*ConsumerDeclaredError].
	ErrConsumerDeclared = errors.New("outbox: the consumer is still declared")

	// ErrNotSupported is wrapped when a store lacks an optional operation a
	// call needs, such as [TxInserter] or [TxCompleter].
	ErrNotSupported = errors.New("outbox: not supported by the store")

	// ErrInvalidConfig is wrapped by every configuration error, of the
	// outbox and of its stores.
	ErrInvalidConfig = errors.New("outbox: invalid configuration")

	// ErrOutcomeUnknown is wrapped by an Insert error when the records may
	// have been saved: the statement, or its commit, was on its way to the
	// database when the connection was lost or the deadline passed, and no
	// answer came. An error without it means that nothing was saved.
	ErrOutcomeUnknown = errors.New("outbox: outcome unknown, the records may have been saved")
)

// ConsumerConflictError is returned by CheckPending when a record whose
// topic declares no consumers was completed by another consumer: two
// handlers receive the topic, and the copy is not a duplicate for this one.
type ConsumerConflictError struct {
	ID          int64
	Consumer    string
	CompletedBy string
}

// Error implements error.
func (e *ConsumerConflictError) Error() string {
	return fmt.Sprintf("outbox: record %d was completed by consumer %q, not by %q", e.ID, e.CompletedBy, e.Consumer)
}

// Unwrap returns [ErrCompletedByOther].
func (e *ConsumerConflictError) Unwrap() error { return ErrCompletedByOther }

// NotDueError is returned by CheckPending when the delivery failed before
// and its next attempt is not due for Wait, by the database clock (see
// [FailureRecorder]).
type NotDueError struct {
	ID   int64
	Wait time.Duration
}

// Error implements error.
func (e *NotDueError) Error() string {
	return fmt.Sprintf("outbox: record %d is due again in %v", e.ID, e.Wait)
}

// Unwrap returns [ErrNotDue].
func (e *NotDueError) Unwrap() error { return ErrNotDue }

// HeldError is returned by CheckPending for an ordered delivery
// ([Delivery.Ordered]) whose record has an earlier record of its topic and
// [Record.OrderKey] that is not complete for the consumer: the handler
// must not run it yet. Before is the earliest such record, the one that can
// run; Abandoned is set when it is abandoned, so that only a requeue (or
// [Delivery.SkipAbandoned]) frees the key.
type HeldError struct {
	ID        int64
	Before    int64
	Abandoned bool
}

// Error implements error.
func (e *HeldError) Error() string {
	if e.Abandoned {
		return fmt.Sprintf("outbox: record %d is held by the abandoned record %d of its key", e.ID, e.Before)
	}
	return fmt.Sprintf("outbox: record %d is held by the pending record %d of its key", e.ID, e.Before)
}

// Unwrap returns [ErrHeld].
func (e *HeldError) Unwrap() error { return ErrHeld }

// ConsumerDeclaredError is returned by the Retire of a [ConsumerDeclarer]
// asked to retire a consumer that the topic's latest declaration lists:
// the service's latest start still declares it, Since ago by the database
// clock, so it may still run. Nothing was completed.
type ConsumerDeclaredError struct {
	Topic    string
	Consumer string
	// Remote reports that it is declared a remote consumer.
	Remote bool
	Since  time.Duration
}

// Error implements error.
func (e *ConsumerDeclaredError) Error() string {
	kind, field := "consumer", "Consumers"
	if e.Remote {
		kind, field = "remote consumer", "RemoteConsumers"
	}
	return fmt.Sprintf("outbox: %s %q of topic %q is declared by the latest start of its service, %v ago: "+
		"it may still run, so its deliveries are not completed; remove it from Tracked.%s and restart the service first",
		kind, e.Consumer, e.Topic, e.Since.Round(time.Second), field)
}

// Unwrap returns [ErrConsumerDeclared].
func (e *ConsumerDeclaredError) Unwrap() error { return ErrConsumerDeclared }
