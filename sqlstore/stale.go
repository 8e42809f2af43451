package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.StaleClaimer = (*Store)(nil)

// ClaimStale implements [recordstore.StaleClaimer]. A record's last send is
// last_sent_at, or created_at when it was only ever sent by the publish that
// saved it (the insert stamps nothing more). A record waiting for the retry
// of a failed handling (due_at in the future) is passed over; one with
// consumers is claimed when the delivery of one of them is due. The claim reads and restamps the
// records in one transaction; on PostgreSQL and MySQL/MariaDB it skips rows
// another claim holds (FOR UPDATE SKIP LOCKED), so concurrent instances never
// claim the same record. SQLite serializes writers and is meant for a
// single node.
func (s *Store) ClaimStale(ctx context.Context, topic string, afterID int64, olderThan time.Duration, limit int) ([]recordstore.Record, error) {
	return s.ClaimStaleBytes(ctx, topic, afterID, olderThan, limit, 0)
}

// ClaimStaleBytes implements [recordstore.ByteBoundedReader]: the rows
// locked but not read for the budget are not stamped, and their locks end
// with the claim's transaction.
func (s *Store) ClaimStaleBytes(ctx context.Context, topic string, afterID int64, olderThan time.Duration, limit, maxBytes int) ([]recordstore.Record, error) {
	return s.claimSent(ctx, s.q.claimStale, topic, afterID, olderThan, limit, maxBytes)
}

var _ recordstore.ReplayClaimer = (*Store)(nil)

// ClaimReplay implements [recordstore.ReplayClaimer]: ClaimStaleBytes that
// also claims the records whose last_sent_at is NULL, whatever their age.
func (s *Store) ClaimReplay(ctx context.Context, topic string, afterID int64, grace time.Duration, limit, maxBytes int) ([]recordstore.Record, error) {
	return s.claimSent(ctx, s.q.claimReplay, topic, afterID, grace, limit, maxBytes)
}

// claimSent runs a claim statement (claimStale or claimReplay) and stamps what
// it read as sent, in one transaction.
func (s *Store) claimSent(ctx context.Context, query, topic string, afterID int64, olderThan time.Duration, limit, maxBytes int) ([]recordstore.Record, error) {
	if olderThan <= 0 || limit < 1 {
		return nil, fmt.Errorf("%w: claiming stale records needs a positive age and limit (got %v, %d)", ErrInvalidConfig, olderThan, limit)
	}
	db, d, err := s.bound(ctx)
	if err != nil {
		return nil, err
	}
	var recs []recordstore.Record
	err = s.inTx(ctx, db, "claim stale", func(tx executor) error {
		rows, err := tx.QueryContext(ctx, query, topic, afterID, micros(olderThan), limit)
		if err != nil {
			return s.fail("claim stale", err)
		}
		if recs, err = s.scanRecords(rows, "claim stale", maxBytes); err != nil || len(recs) == 0 {
			return err
		}
		args := make([]any, len(recs))
		for i, r := range recs {
			args[i] = r.ID
		}
		if _, err := tx.ExecContext(ctx, s.q.stamp+idList(d, 1, len(recs)), args...); err != nil {
			return s.fail("claim stale", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return recs, nil
}

var _ recordstore.SendStamper = (*Store)(nil)

// StampSent implements [recordstore.SendStamper], with one UPDATE per thousand
// ids.
func (s *Store) StampSent(ctx context.Context, ids []int64) error {
	db, d, err := s.bound(ctx)
	if err != nil {
		return err
	}
	for start := 0; start < len(ids); start += stampChunk {
		chunk := ids[start:min(start+stampChunk, len(ids))]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		if _, err := db.ExecContext(ctx, s.q.stamp+idList(d, 1, len(chunk)), args...); err != nil {
			return s.fail("stamp sent", err)
		}
	}
	return nil
}
