package recordstore

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Record is the row saved for one tracked message.
type Record struct {
	// ID is assigned by the store on insert; ids only grow and are never reused.
	ID int64
	// Topic is the tracked topic the message was published to.
	Topic string
	// UUID, Payload and Metadata are the message's own, as published
	// (without the outbox keys).
	UUID     string
	Payload  []byte
	Metadata message.Metadata
	// Consumers are the declared consumers of the topic at publish
	// (outbox.Tracked.Consumers), set by the publisher for Insert: the store
	// keeps one delivery per consumer, and the record is complete once
	// each of them is. Empty for a topic with one receiver. Stores do not
	// fill it in the records they return.
	Consumers []string
	// Origin, when not empty, keys the record: a store holds at most one
	// record per Origin, so that saving the same message again saves
	// nothing. Insert (and [TxInserter.InsertTx]) of a record whose Origin
	// a record of the store already has saves no row for it and sets its
	// ID, UUID, Payload and Metadata to the saved record's, so that the
	// caller sends the saved message. A store keeps an Origin as long as
	// it keeps the record: a table that deletes completed records forgets
	// it once the record is complete. Origin is opaque to the store, at
	// most [MaxOriginLen] bytes. The outbox sets it on the messages a
	// router handler of a tracked message produces, to the consuming
	// delivery and the message's position, so that a rerun of the handler
	// after a failed publish reuses the records of the first run. Stores
	// do not fill it in the records they return.
	Origin string
	// OrderKey, when not empty, orders the record among the records of
	// its topic with the same key: a delivery with [Delivery.Ordered] is
	// held while an earlier record (a lower id) of its topic and key is
	// pending for the delivery's consumer (see [HeldError]). The outbox
	// sets it from the metadata key that outbox.Tracked.OrderKey names; at
	// most [MaxOrderKeyLen] bytes. Stores do not fill it in the records
	// they return.
	OrderKey string
}

// MaxOrderKeyLen is the longest [Record.OrderKey] a store must accept, in
// bytes.
const MaxOrderKeyLen = 255

// MaxOriginLen is the longest [Record.Origin] a store must accept, in
// bytes.
const MaxOriginLen = 255

// Delivery names one delivery of a record to one consumer: the record, the
// topic the consumer subscribed to, and the consumer itself. The middleware
// builds it from the message and its router context; the store checks and
// completes the record for this consumer only.
type Delivery struct {
	// ID is the record id.
	ID int64
	// Topic is the topic the consumer subscribed to. A record whose topic
	// is another is not this delivery's: CheckPending reports
	// [ErrUnknownRecord].
	Topic string
	// Consumer is the name of the Watermill handler receiving the message;
	// "" outside a router.
	Consumer string
	// Lease is a token unique to this delivery. A store with a delivery
	// lease records it with its claim, so that only this delivery releases
	// the claim ([Releaser]).
	Lease string
	// UUID is the delivered message's UUID. When it is set, CheckPending
	// and Complete act only on a record saved with this UUID: CheckPending
	// reports an error wrapping [ErrMessageMismatch] for a record of the id
	// and topic that was saved with another, and Complete changes nothing
	// and reports [ErrNotPending], so that a message naming another
	// message's record is never handled in its place. Empty means "not
	// checked" (operators' tools, which name a record by its id alone).
	UUID string
	// Declared are the consumers the topic declares now
	// (outbox.Tracked.Consumers), which may differ from those its records
	// were saved with: the middleware sets it from the registry, sharing
	// the registry's slice, which the store must not change. A record
	// saved without consumers, or without one of these, that a declared
	// consumer checks, completes or fails is first given one pending
	// delivery per declared consumer it lacks, so that a topic whose
	// consumers are added while records are pending has each of them
	// handle every such record, and the record completes only when all
	// have. A record saved without consumers that was completed before
	// stays complete. Empty: the records are taken as they were saved.
	Declared []string
	// Ordered asks CheckPending to hold the record while an earlier record
	// of its topic and [Record.OrderKey] is not complete for the consumer:
	// pending, or abandoned unless SkipAbandoned is set. The middleware
	// sets it for topics with an ordering key (outbox.Tracked.OrderKey);
	// false costs nothing.
	Ordered bool
	// SkipAbandoned, with Ordered, lets an abandoned earlier record stop
	// holding the later records of its key.
	SkipAbandoned bool
}

// Store keeps the records of tracked messages. The sqlstore package provides
// implementations for PostgreSQL, MySQL/MariaDB and SQLite.
//
// Every method runs on the store's own connection pool, never inside a
// caller's transaction, and returns the connection before it returns.
//
// A record saved with [Record.Consumers] has one delivery per consumer: the
// per-delivery methods act on the delivery of [Delivery.Consumer], and the
// record is complete (marked or deleted) when every delivery is complete. A
// record saved without consumers has one receiver: it is completed by the
// first consumer that completes it, and the store remembers which one where
// it keeps completed records, so that another consumer's copy is reported
// with a [*ConsumerConflictError] rather than taken for a duplicate. A
// delivery that carries the topic's declared consumers ([Delivery.Declared])
// gives such a record, while it is pending, a delivery per declared
// consumer first, and acts on it as on a record saved with them.
type Store interface {
	// Identity returns the stable identity of the store's table: created
	// with the table, the same for every store value on that table, and
	// different for every other table. The publisher stamps it into each
	// message (outbox.MetadataTable) so that a receiver acts only on its own
	// records. It may read the database the first time.
	Identity(ctx context.Context) (string, error)

	// Insert saves the records in one round trip, committed on its own, and
	// sets each record's ID in place, in order, with one pending delivery
	// per consumer of records that declare them. A record whose
	// [Record.Origin] the store already holds is not saved again: it gets
	// the saved record's ID, UUID, Payload and Metadata instead. On an
	// error that wraps [ErrOutcomeUnknown] the records may have been saved
	// (the connection was lost, or ctx ended, while the statement or its
	// commit was on its way); on any other error no record was saved.
	Insert(ctx context.Context, records []Record) error

	// CheckPending returns nil when the record is pending for the
	// delivery's consumer and belongs to its topic. Otherwise:
	//
	//   - ErrNotPending: this consumer completed it, it was abandoned, or
	//     (on a table that deletes completed records) it is gone;
	//   - a [*ConsumerConflictError] (wrapping ErrCompletedByOther): a
	//     record without declared consumers was completed by another
	//     consumer, and the delivery declares none ([Delivery.Declared]);
	//   - an error wrapping ErrUnknownRecord: no record with this id and
	//     topic (on a table that keeps completed records);
	//   - an error wrapping ErrMessageMismatch: [Delivery.UUID] is set and
	//     the record with this id and topic was saved with another UUID,
	//     whatever its state (a store that deletes completed records
	//     reports a completed one as ErrNotPending, as it has no row left
	//     to compare); nothing is changed, no lease is taken. Read in the
	//     same round trip as the record's state; a UUID the store cannot
	//     keep (see ErrInvalidValue) too, as no record was saved with it;
	//   - an error wrapping ErrNoDelivery: the record declares consumers and
	//     this consumer is not one of them;
	//   - a [*NotDueError] (wrapping ErrNotDue): the delivery failed before
	//     and its next attempt is not due yet (see [FailureRecorder]);
	//   - ErrLeased: a store with a delivery lease, another delivery holds
	//     it (see [Releaser]); the check claims it otherwise;
	//   - a [*HeldError] (wrapping ErrHeld): [Delivery.Ordered] is set and
	//     an earlier record of the record's key is not complete for this
	//     consumer; read in the same round trip as the record's state, and
	//     reported only for a record that is pending for the consumer;
	//   - an error wrapping ErrInvalidValue: the store cannot keep or
	//     compare the delivery's Consumer or Topic; nothing is changed,
	//     and no retry tells more;
	//   - any other error when the store could not tell.
	CheckPending(ctx context.Context, d Delivery) error

	// Complete completes the delivery's record for its consumer with the
	// database clock: marks it processed, or deletes it, depending on the
	// store, once no consumer is left. It returns ErrNotPending, and
	// changes nothing, when the delivery was not pending, and also when
	// [Delivery.UUID] is set and the record was saved with another UUID:
	// the completing statement matches no row either way, and telling the
	// two apart would cost another round trip. CheckPending, which runs
	// first, tells them apart. A UUID, Consumer or Topic the store cannot
	// keep gets an error wrapping ErrInvalidValue, changing nothing, and
	// fails no other call's completion.
	Complete(ctx context.Context, d Delivery) error

	// PendingAfter returns up to limit pending records of the topic whose id is
	// greater than afterID, ordered by id. A record is pending while any of
	// its consumers has not completed it.
	PendingAfter(ctx context.Context, topic string, afterID int64, limit int) ([]Record, error)
}

// Verifier is implemented by a [Store] that can check that it is ready for
// use, e.g. that its table exists at the schema version the code expects.
// outbox.Replay and outbox.ReplayPlugin call Verify once per distinct store before
// replaying anything, so that a missing or mismatched table stops the start
// with the store's own error rather than with a confusing SQL error later.
// The sqlstore package's stores implement it.
type Verifier interface {
	Verify(ctx context.Context) error
}
