package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// dashboardQueries are the statements of the dashboard's reads and actions
// (the outboxui package) besides its pages of records (Operator.List): a
// record's retry times, making one record due, and the activity of the
// last hour.
type dashboardQueries struct {
	// recordWait and deliveryWait read the microseconds until a record's,
	// or its deliveries', next attempt is due (NULL when due).
	recordWait   string
	deliveryWait string
	// makeDue makes one pending record due, as MakeDue does.
	makeDue string

	// The activity of the last hour (activity.go).
	pendingCreated     string
	completedWindow    string // "" on a deleting table
	abandonedWindow    string
	abandonedConsumers string
}

// buildDashboard builds the dashboard's statements.
func (q *queries) buildDashboard(f fragments) {
	t, tc, p := f.t, f.tc, f.p
	b := &q.dashboard
	b.recordWait = fmt.Sprintf("SELECT %s FROM %s WHERE id = %s", f.wait("due_at"), t, p(1))
	b.deliveryWait = fmt.Sprintf("SELECT consumer, %s FROM %s WHERE record_id = %s", f.wait("due_at"), tc, p(1))
	b.makeDue = fmt.Sprintf("UPDATE %s SET last_sent_at = %s WHERE id = %s AND %s", t, p(1), p(2), f.pending)
	b.buildActivity(f)
}

// RetryTimes says when the next attempts of a record's deliveries are due,
// after failed handlings (the backoff of outbox.Config.RetryBackoff): zero
// when due now.
type RetryTimes struct {
	// Record is the wait of a record without consumers.
	Record time.Duration
	// Deliveries is the wait of each consumer's delivery of a record
	// saved with consumers.
	Deliveries map[string]time.Duration
}

// RetryDue reads when the next attempts of the record's deliveries are
// due, or an error wrapping [ErrRecordNotFound].
func (o *Operator) RetryDue(ctx context.Context, id int64) (RetryTimes, error) {
	s := o.s
	db, err := s.pool()
	if err != nil {
		return RetryTimes{}, err
	}
	var wait sql.NullInt64
	if err := db.QueryRowContext(ctx, s.q.dashboard.recordWait, id).Scan(&wait); err != nil {
		if err == sql.ErrNoRows { //nolint:errorlint // QueryRow returns it unwrapped
			return RetryTimes{}, &TableError{Table: s.table, Op: "retry due", Err: fmt.Errorf("record %d: %w", id, ErrRecordNotFound)}
		}
		return RetryTimes{}, s.fail("retry due", err)
	}
	out := RetryTimes{Record: waitOf(wait)}
	rows, err := db.QueryContext(ctx, s.q.dashboard.deliveryWait, id)
	if err != nil {
		return RetryTimes{}, s.fail("retry due", err)
	}
	defer rows.Close()
	for rows.Next() {
		var consumer string
		if err := rows.Scan(&consumer, &wait); err != nil {
			return RetryTimes{}, s.fail("retry due", err)
		}
		if out.Deliveries == nil {
			out.Deliveries = map[string]time.Duration{}
		}
		out.Deliveries[consumer] = waitOf(wait)
	}
	if err := rows.Err(); err != nil {
		return RetryTimes{}, s.fail("retry due", err)
	}
	return out, nil
}

// waitOf reads a wait column: the microseconds until due, NULL when due.
func waitOf(micros sql.NullInt64) time.Duration {
	if !micros.Valid || micros.Int64 <= 0 {
		return 0
	}
	return time.Duration(micros.Int64) * time.Microsecond
}

// MakeRecordDue marks one pending record as last sent long ago, as
// [Operator.MakeDue] does, so that the service's outbox.StaleResubmitter
// sends it at its next round. It reports whether the record was pending.
func (o *Operator) MakeRecordDue(ctx context.Context, id int64) (bool, error) {
	s := o.s
	db, err := s.pool()
	if err != nil {
		return false, err
	}
	res, err := db.ExecContext(ctx, s.q.dashboard.makeDue, dueLongAgo, id)
	if err != nil {
		return false, s.fail("make due", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, s.fail("make due", err)
	}
	return n > 0, nil
}
