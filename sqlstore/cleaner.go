package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.Cleaner = (*Store)(nil)

// Clean implements [recordstore.Cleaner]: one short transaction deletes
// at most limit completed records whose processed_at is older than
// olderThan by the database clock, oldest first, with the delivery rows of
// those that had consumers. Abandoned records are kept. On PostgreSQL and
// MySQL/MariaDB it skips rows another cleaning holds (FOR UPDATE SKIP LOCKED),
// so that two cleaners take different rows instead of queueing behind each
// other; on MySQL/MariaDB the transaction is READ COMMITTED, so that its
// locking read takes no gap locks that concurrent inserts would wait for. A
// large backlog is cleaned in bounded batches that never hold locks for
// long. A deleting table keeps no completed records, so there it deletes
// nothing. A partitioned table ([Config.PartitionEvery]) drops its old
// partitions whole; see [Store.Rotate].
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
	return s.cleanFrom(ctx, db, d, s.q.cleanSelect, olderThan, limit)
}

// cleanFrom is one batch of Clean, of the records that selectOld (the
// statement cleanSelect, or one of a partition) picks.
func (s *Store) cleanFrom(ctx context.Context, db *sqlx.DB, d *Dialect, selectOld string, olderThan time.Duration, limit int) (int, error) {
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
