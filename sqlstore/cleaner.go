package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.Cleaner = (*Store)(nil)

// Clean implements [recordstore.Cleaner]: it deletes at most limit
// completed records whose processed_at is older than olderThan by the
// database clock, oldest first, with the delivery rows of those that had
// consumers. Abandoned records are kept. Two cleaners take different rows
// instead of queueing behind each other: on PostgreSQL one statement skips
// the rows another transaction holds (it locks none first, and commits
// without waiting for the disk: a batch a crash loses is deleted again);
// on MySQL/MariaDB a READ COMMITTED transaction picks them with FOR UPDATE
// SKIP LOCKED, taking no gap locks that concurrent inserts would wait
// for. A large backlog is cleaned in bounded batches that never hold
// locks for long. A deleting table keeps no completed records, so there it
// deletes nothing. A partitioned table ([Config.PartitionEvery]) drops its
// old partitions whole; see [Store.Rotate].
func (s *Store) Clean(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := checkClean(s.table, olderThan, limit); err != nil {
		return 0, err
	}
	if s.mode != Mark {
		return 0, nil
	}
	db, d, err := s.bound(ctx)
	if err != nil {
		return 0, err
	}
	if s.partitionEvery > 0 {
		return s.cleanPartitioned(ctx, db, d, olderThan, limit)
	}
	return s.cleanFrom(ctx, db, d, s.q.cleanOne, s.q.cleanSelect, olderThan, limit)
}

// cleanFrom is one batch of Clean: the statement one (cleanOne, or a
// partition's) where the dialect has one, and otherwise the records that
// selectOld (cleanSelect, or a partition's) picks, deleted in the same
// transaction.
func (s *Store) cleanFrom(ctx context.Context, db *sqlx.DB, d *Dialect, one, selectOld string, olderThan time.Duration, limit int) (int, error) {
	if one != "" {
		var n int
		if err := db.QueryRowContext(ctx, one, micros(olderThan), limit).Scan(&n); err != nil {
			return 0, s.fail("clean", err)
		}
		return n, nil
	}
	var cleaned int
	err := s.inTxWith(ctx, db, "clean", d.cleanTxOptions, func(tx executor) error {
		rows, err := tx.QueryContext(ctx, selectOld, micros(olderThan), limit)
		if err != nil {
			return s.fail("clean", err)
		}
		var ids, withConsumers []int64
		for rows.Next() {
			var id int64
			var consumers int
			if err := rows.Scan(&id, &consumers); err != nil {
				rows.Close()
				return s.fail("clean", err)
			}
			ids = append(ids, id)
			if consumers > 0 {
				withConsumers = append(withConsumers, id)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return s.fail("clean", err)
		}
		if err := s.deleteIDs(ctx, tx, d, s.q.cleanDeliveries, withConsumers); err != nil {
			return err
		}
		if err := s.deleteIDs(ctx, tx, d, s.q.cleanRecords, ids); err != nil {
			return err
		}
		cleaned = len(ids)
		return nil
	})
	return cleaned, err
}

// deleteIDs runs a statement prefix ending in "IN " for ids, in chunks.
func (s *Store) deleteIDs(ctx context.Context, tx executor, d *Dialect, prefix string, ids []int64) error {
	if err := execLists(ctx, tx, d, prefix, nil, anys(ids)); err != nil {
		return s.fail("clean", err)
	}
	return nil
}

// checkClean refuses the arguments of a Clean of the table, of records or
// of inbox entries, that clean nothing sensible.
func checkClean(table string, olderThan time.Duration, limit int) error {
	if olderThan < 0 || limit < 1 {
		return fmt.Errorf("%w: cleaning table %q needs a non-negative age and a positive limit (got %v, %d)", ErrInvalidConfig, table, olderThan, limit)
	}
	return nil
}
