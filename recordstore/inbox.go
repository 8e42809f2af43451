package recordstore

import (
	"context"
	"time"
)

// InboxEntry names one message, or one operation, that one consumer handled.
// A receiving service keeps entries for the messages of other services
// (whose records it cannot see), so that a copy it has already handled is
// acknowledged without running the handler.
type InboxEntry struct {
	// Consumer is the name of the Watermill handler that handled the
	// message. Required.
	Consumer string
	// MessageUUID is the handled message's UUID: resends of a record keep
	// it, so every copy of one message has one entry. Required.
	MessageUUID string
	// BusinessKey, when not empty, names the operation the message asks
	// for (an order number, a payment reference): a message with another
	// UUID and the same business key is a duplicate for this consumer too.
	BusinessKey string
	// Source is the table identity of the sending service's record
	// (outbox.MetadataTable), and RecordID its record id; both are kept
	// for operators and may be empty or zero.
	Source   string
	RecordID int64
}

// Inbox keeps, per consumer, the messages it has handled. Entries are
// written once and read by key: (Consumer, MessageUUID), and (Consumer,
// BusinessKey) when the business key is set; entries without a business key
// never conflict on it. An entry without a Consumer or a MessageUUID, or
// one the inbox cannot keep, is refused by every method with an error
// wrapping ErrInvalidEntry. The sqlstore package provides one for
// PostgreSQL, MySQL/MariaDB and SQLite, and the outboxtest package an
// in-memory one; sqlstore/storetest's RunInbox is the contract suite they
// pass.
type Inbox interface {
	// Handled reports whether the consumer has an entry with the entry's
	// MessageUUID, or, when BusinessKey is set, with its BusinessKey.
	Handled(ctx context.Context, e InboxEntry) (bool, error)
	// MarkHandled saves the entry on the inbox's own connection, committed
	// on its own. It returns ErrAlreadyHandled, saving nothing, when
	// Handled would have reported true.
	MarkHandled(ctx context.Context, e InboxEntry) error
	// MarkHandledTx saves the entry through tx, the handler's own
	// transaction on the inbox's database, so that the entry commits or
	// rolls back with the handler's writes. A concurrent transaction
	// saving the same key waits for tx and then gets ErrAlreadyHandled.
	// It returns ErrAlreadyHandled when the entry exists.
	MarkHandledTx(ctx context.Context, tx Tx, e InboxEntry) error
	// Clean deletes up to limit entries saved more than olderThan ago by
	// the database clock, and returns how many it deleted.
	Clean(ctx context.Context, olderThan time.Duration, limit int) (int, error)
}

// InboxFinder is implemented by an [Inbox] that names the entry a message
// duplicates, so that a message skipped for its business key is logged
// with the UUID of the message that was handled. The sqlstore package's
// Inbox and the outboxtest package's implement it.
type InboxFinder interface {
	// HandledAs returns the consumer's entry with e's MessageUUID, or,
	// when e has a BusinessKey, with that key; nil when there is none. It
	// answers as Handled does, in one round trip.
	HandledAs(ctx context.Context, e InboxEntry) (*InboxEntry, error)
}
