package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/wmoutbox/outbox/recordstore"
)

var (
	_ recordstore.TxInserter  = (*Store)(nil)
	_ recordstore.TxCompleter = (*Store)(nil)
)

// InsertTx implements [recordstore.TxInserter]: the same statements as Insert,
// run through the caller's transaction tx, which must be on the store's
// database. A MySQL store needs its pool attached even so: it learns the
// server from it once; the pool tx comes from needs interpolateParams=true
// too, or each statement costs a prepare and a close.
func (s *Store) InsertTx(ctx context.Context, tx recordstore.Tx, records []recordstore.Record) error {
	if tx == nil {
		return fmt.Errorf("%w: transaction is nil", ErrInvalidConfig)
	}
	if len(records) == 0 {
		return nil
	}
	d := s.dialect
	if _, probes := d.(serverProber); probes {
		var err error
		if _, d, err = s.bound(ctx); err != nil {
			return err
		}
	}
	if err := s.insertWith(ctx, tx, d, "insert in transaction", records); err != nil {
		if errors.Is(err, ErrInvalidRecord) {
			return err
		}
		return s.fail("insert in transaction", err)
	}
	return nil
}

// CompleteTx implements [recordstore.TxCompleter] with the store's own
// statements run through the caller's transaction tx. A record without
// consumers is completed by one statement (UPDATE … SET processed_at, or
// DELETE) that locks its row, which is what a SELECT … FOR UPDATE would do,
// and completes it in the same round trip; a consumer's delivery is
// completed as Complete does, after a write that locks the record's row:
//
//   - PostgreSQL and MySQL/MariaDB (InnoDB) lock the row until tx ends. A
//     concurrent CompleteTx of the same delivery waits; when the first
//     transaction commits, it re-reads the row, matches nothing and returns
//     [recordstore.ErrNotPending]; when the first rolls back, it completes the
//     delivery itself. Under REPEATABLE READ or SERIALIZABLE, PostgreSQL
//     reports the concurrent completion as a serialization failure instead,
//     which the handler returns, and the redelivery finds the record
//     completed.
//   - SQLite has no row locks: a writing transaction holds the database's
//     single write lock until it ends, so concurrent completions are
//     serialized by the busy timeout (set _pragma=busy_timeout(…) in the
//     DSN). Run CompleteTx as the first statement of the transaction, or
//     open the pool with _txlock=immediate: a deferred transaction that read
//     before it writes cannot wait for the lock and fails with SQLITE_BUSY.
func (s *Store) CompleteTx(ctx context.Context, tx recordstore.Tx, d recordstore.Delivery) error {
	if tx == nil {
		return fmt.Errorf("%w: transaction is nil", ErrInvalidConfig)
	}
	if !declares(d) {
		n, err := s.exec(ctx, tx, "complete in transaction", s.q.complete, s.completeArgs(d)...)
		if err != nil {
			return err
		}
		if n == 1 {
			return nil
		}
	}
	return s.completeDelivery(ctx, tx, d, "complete in transaction", s.q.lockRecord)
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
