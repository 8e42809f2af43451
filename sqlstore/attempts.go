package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/wmoutbox/outbox"
)

// MaxErrorLength bounds the error text kept with a record, in bytes; longer
// text is cut at a character boundary.
const MaxErrorLength = 1024

var (
	_ outbox.FailureRecorder = (*Store)(nil)
	_ outbox.Resubmitter     = (*Store)(nil)
)

// RecordFailure implements [outbox.FailureRecorder]: it counts a failed
// handling of a pending record, keeps the error text (at most
// [MaxErrorLength] bytes) and, when maxAttempts > 0 and the count reaches
// it, abandons the record: abandoned_at (and, on a marking table,
// processed_at) is set from the database clock and the row is kept. It is
// called only when a handler fails.
func (s *Store) RecordFailure(ctx context.Context, id int64, reason string, maxAttempts int) (attempts int, abandoned bool, err error) {
	reason = cutUTF8(reason, MaxErrorLength)
	err = s.inTx(ctx, "record failure", func(tx *sqlx.Tx, d Dialect) error {
		o := opsOf(d)
		p := d.placeholder
		sel := fmt.Sprintf("SELECT attempts FROM %s WHERE id = %s AND %s%s", d.quote(s.table), p(1), s.pendingCond(), o.lockRows(false))
		switch err := tx.QueryRowContext(ctx, sel, id).Scan(&attempts); {
		case errors.Is(err, sql.ErrNoRows):
			return outbox.ErrNotPending
		case err != nil:
			return s.fail("record failure", err)
		}
		attempts++
		abandoned = maxAttempts > 0 && attempts >= maxAttempts
		set := fmt.Sprintf("attempts = %s, last_error = %s", p(1), p(2))
		if abandoned {
			set += ", abandoned_at = " + d.clock()
			if s.mode == Mark {
				set += ", processed_at = " + d.clock()
			}
		}
		upd := fmt.Sprintf("UPDATE %s SET %s WHERE id = %s", d.quote(s.table), set, p(3))
		if _, err := tx.ExecContext(ctx, upd, attempts, reason, id); err != nil {
			return s.fail("record failure", err)
		}
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	return attempts, abandoned, nil
}

// ResubmitAbandoned implements [outbox.Resubmitter]: it makes an abandoned
// record pending again, with its attempts reset to zero and its send time
// set to now, and returns it for sending. The last error is kept.
func (s *Store) ResubmitAbandoned(ctx context.Context, id int64) (outbox.Record, error) {
	var rec outbox.Record
	err := s.inTx(ctx, "resubmit", func(tx *sqlx.Tx, d Dialect) error {
		p := d.placeholder
		t := d.quote(s.table)
		sel := fmt.Sprintf("SELECT id, topic, uuid, payload, metadata FROM %s WHERE id = %s AND abandoned_at IS NOT NULL%s", t, p(1), opsOf(d).lockRows(false))
		rows, err := tx.QueryContext(ctx, sel, id)
		if err != nil {
			return s.fail("resubmit", err)
		}
		recs, err := s.scanRecords(rows, "resubmit")
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return fmt.Errorf("record %d: %w", id, outbox.ErrNotAbandoned)
		}
		rec = recs[0]
		set := "abandoned_at = NULL, attempts = 0, last_sent_at = " + d.clock()
		if s.mode == Mark {
			set += ", processed_at = NULL"
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET %s WHERE id = %s", t, set, p(1)), id); err != nil {
			return s.fail("resubmit", err)
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
