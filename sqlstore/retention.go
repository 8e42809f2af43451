package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/wmoutbox/outbox"
)

var _ outbox.Purger = (*Store)(nil)

// PurgeCompleted implements [outbox.Purger]: one DELETE of at most limit
// completed records whose processed_at is older than olderThan by the
// database clock, oldest first. Abandoned records are kept. Each call is
// one short statement, so a large backlog is purged in bounded batches that
// never hold locks for long. A deleting table keeps no completed records,
// so there it deletes nothing.
func (s *Store) PurgeCompleted(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if olderThan < 0 || limit < 1 {
		return 0, fmt.Errorf("%w: purging needs a non-negative age and a positive limit (got %v, %d)", ErrInvalidConfig, olderThan, limit)
	}
	if s.mode != Mark {
		return 0, nil
	}
	db, d, err := s.bound(ctx)
	if err != nil {
		return 0, err
	}
	res, err := db.ExecContext(ctx, opsOf(d).purgeQuery(d.quote(s.table)), micros(olderThan), limit)
	if err != nil {
		return 0, s.fail("purge", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.fail("purge", err)
	}
	return int(n), nil
}
