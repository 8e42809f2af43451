package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/wmoutbox/outbox"
)

var _ outbox.StatusReader = (*Store)(nil)

// PendingStatus implements [outbox.StatusReader]. It reads the pending
// records only, through the pending index.
func (s *Store) PendingStatus(ctx context.Context) ([]outbox.NameStatus, error) {
	db, d, err := s.bound(ctx)
	if err != nil {
		return nil, err
	}
	q := fmt.Sprintf("SELECT topic, COUNT(*), %s FROM %s WHERE %s GROUP BY topic ORDER BY topic",
		opsOf(d).ageMicros("MIN(created_at)"), d.quote(s.table), s.pendingCond())
	return s.readStatus(ctx, db, q, false)
}

// Status implements [outbox.StatusReader]. It reads the whole table.
func (s *Store) Status(ctx context.Context) ([]outbox.NameStatus, error) {
	db, d, err := s.bound(ctx)
	if err != nil {
		return nil, err
	}
	pending := s.pendingCond()
	completed := "0"
	if s.mode == Mark {
		completed = "SUM(CASE WHEN processed_at IS NOT NULL AND abandoned_at IS NULL THEN 1 ELSE 0 END)"
	}
	q := fmt.Sprintf(`SELECT topic, SUM(CASE WHEN %s THEN 1 ELSE 0 END), %s,
SUM(CASE WHEN abandoned_at IS NOT NULL THEN 1 ELSE 0 END), %s
FROM %s GROUP BY topic ORDER BY topic`,
		pending, opsOf(d).ageMicros("MIN(CASE WHEN "+pending+" THEN created_at END)"), completed, d.quote(s.table))
	return s.readStatus(ctx, db, q, true)
}

type statusQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (s *Store) readStatus(ctx context.Context, db statusQuerier, q string, full bool) ([]outbox.NameStatus, error) {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, s.fail("status", err)
	}
	defer rows.Close()
	var out []outbox.NameStatus
	for rows.Next() {
		var st outbox.NameStatus
		var age sql.NullInt64
		dest := []any{&st.Name, &st.Pending, &age}
		if full {
			dest = append(dest, &st.Abandoned, &st.Completed)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, s.fail("status", err)
		}
		if age.Valid && age.Int64 > 0 {
			st.OldestPending = time.Duration(age.Int64) * time.Microsecond
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("status", err)
	}
	return out, nil
}
