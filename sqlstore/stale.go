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

var _ recordstore.SpacedClaimer = (*Store)(nil)

// ClaimSpaced implements [recordstore.SpacedClaimer] with one claim
// statement: a record's wait after its last send (last_sent_at, or
// created_at) is minAge, or twice its wait from created_at to that send
// when that is longer, and at most maxAge.
func (s *Store) ClaimSpaced(ctx context.Context, topic string, afterID int64, minAge, maxAge time.Duration, limit, maxBytes int) ([]recordstore.Record, error) {
	if maxAge < minAge {
		return nil, fmt.Errorf("%w: claiming records with spaced resends needs a maximum age (%v) no shorter than the minimum (%v)", ErrInvalidConfig, maxAge, minAge)
	}
	return s.claimSent(ctx, s.q.claimSpaced, topic, afterID, minAge, limit, maxBytes, micros(maxAge))
}

// claimSent runs a claim statement (claimStale, claimReplay or
// claimSpaced, whose extra argument comes after the age) and stamps what
// it read as sent, in one transaction.
func (s *Store) claimSent(ctx context.Context, query, topic string, afterID int64, olderThan time.Duration, limit, maxBytes int, extra ...any) ([]recordstore.Record, error) {
	if olderThan <= 0 || limit < 1 {
		return nil, fmt.Errorf("%w: claiming stale records needs a positive age and limit (got %v, %d)", ErrInvalidConfig, olderThan, limit)
	}
	db, d, err := s.bound(ctx)
	if err != nil {
		return nil, err
	}
	args := append(append([]any{topic, afterID, micros(olderThan)}, extra...), limit)
	var recs []recordstore.Record
	err = s.inTx(ctx, db, "claim stale", func(tx executor) error {
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return s.fail("claim stale", err)
		}
		if recs, err = s.scanRecords(rows, "claim stale", maxBytes); err != nil || len(recs) == 0 {
			return err
		}
		ids := make([]any, len(recs))
		for i, r := range recs {
			ids[i] = r.ID
		}
		if _, err := tx.ExecContext(ctx, s.q.stamp+idList(d, 1, len(recs)), ids...); err != nil {
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
	if err := execLists(ctx, db, d, s.q.stamp, nil, anys(ids)); err != nil {
		return s.fail("stamp sent", err)
	}
	return nil
}
