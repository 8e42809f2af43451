package sqlstore

import (
	"context"
	"database/sql"

	"github.com/jmoiron/sqlx"
)

// executor runs the store's statements: the store's pool, a transaction of
// its own, a caller's transaction or a pinned connection. *sqlx.DB,
// *sqlx.Tx, *sql.Tx, *sqlx.Conn and [recordstore.Tx] all have these
// methods, so every statement runs through the same code whichever it is.
type executor interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// inTx runs fn, whose statements must succeed or fail together, in a
// transaction: one of its own, committed when fn returns nil, when db is the
// store's pool; the caller's transaction as it is otherwise, since the caller
// commits it. Beginning or committing a transaction fails as op; fn's
// errors are returned as they are.
func (s *Store) inTx(ctx context.Context, db executor, op string, fn func(tx executor) error) error {
	return s.inTxWith(ctx, db, op, nil, fn)
}

// inTxWith is inTx with the transaction's options (nil for the defaults).
func (s *Store) inTxWith(ctx context.Context, db executor, op string, opts *sql.TxOptions, fn func(tx executor) error) error {
	pool, ok := db.(*sqlx.DB)
	if !ok {
		return fn(db)
	}
	tx, err := pool.BeginTxx(ctx, opts)
	if err != nil {
		return s.fail(op, err)
	}
	defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return s.fail(op, err)
	}
	return nil
}
