package sqlstore

// The helpers every operation runs its statements through.

import (
	"context"
	"database/sql"
	"strings"

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

// exec runs a statement and returns the number of rows it changed.
func (s *Store) exec(ctx context.Context, db executor, op, query string, args ...any) (int64, error) {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, s.fail(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.fail(op, err)
	}
	return n, nil
}

// fail names the table and the operation an error happened in, and turns a
// driver error into the package's sentinels. An error already named for
// this table is returned as it is, so that callers can name every error of
// a call without naming any twice.
func (v *versioned) fail(op string, err error) error {
	if te, ok := err.(*TableError); ok && te.Table == v.table { //nolint:errorlint // only an error named here, not one it wraps
		return err
	}
	return &TableError{Table: v.table, Op: op, Err: v.dialect.convertError(err)}
}

// The statements whose text depends on a number of ids are built per call,
// from a prefix built once.

// idList is "(p1, p2, …)" for n ids starting at placeholder first.
func idList(d *Dialect, first, n int) string {
	var b strings.Builder
	b.WriteByte('(')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(d.placeholder(first + i))
	}
	b.WriteByte(')')
	return b.String()
}

// deliveryChunk bounds the rows of one statement that lists them, well
// within every database's limit on bound parameters.
const deliveryChunk = 500

// stampChunk bounds the ids of one UPDATE, well within every database's
// limit on bound parameters.
const stampChunk = 1000

// chunks calls f with each run of at most stampChunk items of list, in
// order, up to its first error.
func chunks[T any](list []T, f func([]T) error) error {
	for start := 0; start < len(list); start += stampChunk {
		if err := f(list[start:min(start+stampChunk, len(list))]); err != nil {
			return err
		}
	}
	return nil
}

// anys is list as statement arguments.
func anys[T any](list []T) []any {
	out := make([]any, len(list))
	for i, v := range list {
		out[i] = v
	}
	return out
}

// execLists runs prefix, followed by a list of placeholders, for each
// chunk of items, with the arguments fixed before the chunk's.
func execLists(ctx context.Context, db executor, d *Dialect, prefix string, fixed, items []any) error {
	return chunks(items, func(chunk []any) error {
		args := append(append(make([]any, 0, len(fixed)+len(chunk)), fixed...), chunk...)
		_, err := db.ExecContext(ctx, prefix+idList(d, len(fixed)+1, len(chunk)), args...)
		return err
	})
}

// queryLists runs prefix, followed by a list of placeholders, for each
// chunk of items, with the arguments fixed before the chunk's, and calls
// scan for each row; an error fails as op.
func (s *Store) queryLists(ctx context.Context, op, prefix string, fixed, items []any, scan func(*sql.Rows) error) error {
	db, d, err := s.bound(ctx)
	if err != nil {
		return err
	}
	return chunks(items, func(chunk []any) error {
		args := append(append(make([]any, 0, len(fixed)+len(chunk)), fixed...), chunk...)
		rows, err := db.QueryContext(ctx, prefix+idList(d, len(fixed)+1, len(chunk)), args...)
		if err != nil {
			return s.fail(op, err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return s.fail(op, err)
			}
		}
		if err := rows.Err(); err != nil {
			return s.fail(op, err)
		}
		return nil
	})
}
