package outbox

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Record is the row saved for one tracked message.
type Record struct {
	// ID is assigned by the store on insert; ids only grow and are never reused.
	ID int64
	// Topic is the tracked name the message was published to.
	Topic string
	// UUID, Payload and Metadata are the message's own, as published
	// (without the outbox keys).
	UUID     string
	Payload  []byte
	Metadata message.Metadata
}

// Store keeps the records of tracked messages. The sqlstore package provides
// implementations for PostgreSQL, MySQL/MariaDB and SQLite.
//
// Every method runs on the store's own connection pool, never inside a
// caller's transaction, and returns the connection before it returns.
type Store interface {
	// Insert saves the records in one round trip, committed on its own, and
	// sets each record's ID in place, in order. On error no record was saved.
	Insert(ctx context.Context, records []Record) error

	// CheckPending returns nil when the record is pending, ErrNotPending when
	// it was completed, deleted or never existed, and any other error when
	// the store could not tell. A store with a delivery lease claims the
	// record here and returns ErrLeased while another delivery holds it
	// (see [Releaser]).
	CheckPending(ctx context.Context, id int64) error

	// Complete marks the record processed with the database clock, or deletes
	// it, depending on the store. It returns ErrNotPending, and changes
	// nothing, when the record was not pending.
	Complete(ctx context.Context, id int64) error

	// PendingAfter returns up to limit pending records of the topic whose id is
	// greater than afterID, ordered by id.
	PendingAfter(ctx context.Context, topic string, afterID int64, limit int) ([]Record, error)
}

// Verifier is implemented by a [Store] that can check that it is ready for
// use, e.g. that its table exists at the schema version the code expects.
// [Replay] and [ReplayPlugin] call Verify once per distinct store before
// replaying anything, so that a missing or mismatched table stops the start
// with the store's own error rather than with a confusing SQL error later.
// The sqlstore package's stores implement it.
type Verifier interface {
	Verify(ctx context.Context) error
}
