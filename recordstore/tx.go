package recordstore

import (
	"context"
	"database/sql"
)

// Tx is a database transaction the caller began and will commit or roll
// back: *sql.Tx and *sqlx.Tx satisfy it, and so does outbox.PublishingTx. Commit
// and Rollback are part of it so that a pool (*sql.DB), which would commit
// each statement on its own, cannot be passed by mistake.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	Commit() error
	Rollback() error
}

// TxInserter is implemented by a [Store] that can save records inside a
// caller's transaction, for outbox.TxPublisher. The sqlstore package's stores
// implement it.
type TxInserter interface {
	// InsertTx saves the records through tx, in one round trip as Insert
	// does, and sets each record's ID in place, in order; a record whose
	// [Record.Origin] the store already holds gets the saved record
	// instead, as with Insert. The records exist once tx commits and
	// vanish if it rolls back. tx must be a transaction on the store's
	// database.
	InsertTx(ctx context.Context, tx Tx, records []Record) error
	// IdentityTx returns the store's identity ([Store.Identity]), reading
	// it through tx when the store does not know it yet, so that a caller
	// holding the pool's only connection in tx does not wait for another.
	IdentityTx(ctx context.Context, tx Tx) (string, error)
}

// TxCompleter is implemented by a [Store] that can complete a record inside
// a caller's transaction, for outbox.CompleteTx. The sqlstore package's stores
// implement it.
type TxCompleter interface {
	// CompleteTx locks the record through tx and completes the delivery
	// there, as Complete does: the completion commits or rolls back with
	// tx. A concurrent transaction completing the same delivery waits for
	// the lock and then gets ErrNotPending. It returns ErrNotPending, and
	// changes nothing, when the delivery is not pending or is of another
	// message than the record's ([Delivery.UUID]), as Complete does.
	CompleteTx(ctx context.Context, tx Tx, d Delivery) error
}
