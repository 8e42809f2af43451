package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/wmoutbox/outbox/recordstore"
)

// MaxErrorLength bounds the error text kept with a record, in bytes; longer
// text is cut at a character boundary.
const MaxErrorLength = 1024

var (
	_ recordstore.FailureRecorder = (*Store)(nil)
	_ recordstore.Requeuer        = (*Store)(nil)
)

// RecordFailure implements [recordstore.FailureRecorder]: it counts a failed
// handling of a pending delivery (the consumer's own row, for a record with
// consumers), keeps the error text (at most [MaxErrorLength] bytes, what the
// database cannot keep in it, such as invalid UTF-8, replaced by U+FFFD) and
// makes the delivery due again retryIn(attempts) later by the database
// clock (at once for a nil retryIn or a delay of zero or less). When
// maxAttempts > 0 and the count reaches it, it abandons the delivery
// instead: abandoned_at is set from the database clock and the row is
// kept; a record without consumers is abandoned with it (and, on a marking
// table, its processed_at set), one with consumers once none of its
// deliveries is pending. It is called only when a handler fails.
func (s *Store) RecordFailure(ctx context.Context, d recordstore.Delivery, reason string, maxAttempts int, retryIn func(attempts int) time.Duration) (attempts int, abandoned bool, err error) {
	reason = s.dialect.textColumn.text(reason, MaxErrorLength)
	db, dia, err := s.bound(ctx)
	if err != nil {
		return 0, false, err
	}
	if err := s.refuses("record failure", d, false); err != nil {
		return 0, false, err
	}
	err = s.inTx(ctx, db, "record failure", func(tx executor) error {
		var consumers int
		switch err := tx.QueryRowContext(ctx, s.q.failureRecord, d.ID).Scan(&consumers, &attempts); {
		case errors.Is(err, sql.ErrNoRows):
			return recordstore.ErrNotPending
		case err != nil:
			return s.fail("record failure", err)
		}
		if consumers > 0 || declares(d) {
			err := tx.QueryRowContext(ctx, s.q.failureDelivery, d.ID, d.Consumer).Scan(&attempts)
			if errors.Is(err, sql.ErrNoRows) && declares(d) {
				// A record saved before its topic declared this
				// consumer: adopted (adopt.go), its failure is the
				// consumer's own.
				if _, err := s.adopt(ctx, tx, d, "record failure"); err != nil {
					return err
				}
				consumers = max(consumers, 1)
				err = tx.QueryRowContext(ctx, s.q.failureDelivery, d.ID, d.Consumer).Scan(&attempts)
			}
			switch {
			case errors.Is(err, sql.ErrNoRows):
				return recordstore.ErrNotPending
			case err != nil:
				return s.fail("record failure", err)
			}
		}
		attempts++
		abandoned = maxAttempts > 0 && attempts >= maxAttempts
		var delay time.Duration
		if retryIn != nil {
			delay = max(retryIn(attempts), 0)
		}
		var err error
		switch {
		case consumers == 0 && abandoned:
			_, err = tx.ExecContext(ctx, s.q.abandonFailed, attempts, reason, d.ID)
		case consumers == 0:
			_, err = tx.ExecContext(ctx, s.q.failRecord, attempts, reason, dia.leaseArg(delay), d.ID)
		case abandoned:
			if _, err = tx.ExecContext(ctx, s.q.abandonDelivery, attempts, reason, d.ID, d.Consumer); err == nil {
				return s.rollUp(ctx, tx, d.ID, "record failure")
			}
		default:
			_, err = tx.ExecContext(ctx, s.q.failDelivery, attempts, reason, dia.leaseArg(delay), d.ID, d.Consumer)
		}
		if err != nil {
			return s.fail("record failure", err)
		}
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	return attempts, abandoned, nil
}

// Requeue implements [recordstore.Requeuer]: it makes an abandoned
// record pending again, with its attempts, and those of its abandoned
// deliveries, reset to zero, due at once, and its send time set to now,
// and returns it for sending. Deliveries other consumers completed stay
// completed. The last errors are kept.
func (s *Store) Requeue(ctx context.Context, id int64) (recordstore.Record, error) {
	db, _, err := s.bound(ctx)
	if err != nil {
		return recordstore.Record{}, err
	}
	var rec recordstore.Record
	err = s.inTx(ctx, db, "requeue", func(tx executor) error {
		rows, err := tx.QueryContext(ctx, s.q.requeueSelect, id)
		if err != nil {
			return s.fail("requeue", err)
		}
		recs, err := s.scanRecords(rows, "requeue", 0)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return fmt.Errorf("record %d: %w", id, recordstore.ErrNotAbandoned)
		}
		rec = recs[0]
		if _, err := tx.ExecContext(ctx, s.q.requeueRecord, id); err != nil {
			return s.fail("requeue", err)
		}
		if _, err := tx.ExecContext(ctx, s.q.requeueDeliveries, id); err != nil {
			return s.fail("requeue", err)
		}
		return nil
	})
	return rec, err
}

// cutUTF8 returns at most n bytes of s, not splitting a character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
