package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// browseQueries are the statements of the dashboard's reads and actions
// (the outboxui package): pages of one topic's records through the pending
// and abandoned indexes, a record's retry times, and the activity of the
// last hour.
type browseQueries struct {
	// byTopic reads a page of one topic's records in a state, through the
	// (topic, id) index of the state; byConsumer a page of one consumer's
	// pending deliveries, through the consumers table's pending index;
	// abandonedOf pages of the records, pending or abandoned, in which a
	// consumer's delivery was abandoned, by state.
	byTopic     map[State]string
	byConsumer  string
	abandonedOf map[State]string
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

// buildBrowse builds the dashboard's statements.
func (q *queries) buildBrowse(f fragments) {
	t, tc, p := f.t, f.tc, f.p
	columns := f.operatorColumns()
	conds := map[State]string{Pending: f.pending, Abandoned: "abandoned_at IS NOT NULL"}
	b := &q.browse
	b.byTopic = make(map[State]string, len(conds))
	b.abandonedOf = make(map[State]string, len(conds))
	for st, cond := range conds {
		b.byTopic[st] = fmt.Sprintf("SELECT %s FROM %s WHERE topic = %s AND %s AND id > %s ORDER BY id LIMIT %s",
			columns, t, p(1), cond, p(2), p(3))
		b.abandonedOf[st] = fmt.Sprintf(`SELECT %s FROM %s r WHERE topic = %s AND %s AND id > %s
  AND EXISTS (SELECT 1 FROM %s c WHERE c.record_id = r.id AND c.consumer = %s AND c.abandoned_at IS NOT NULL)
ORDER BY id LIMIT %s`, columns, t, p(1), cond, p(2), tc, p(3), p(4))
	}
	// The page is a derived table rather than an IN (subquery), which
	// MySQL refuses with a LIMIT.
	b.byConsumer = fmt.Sprintf(`SELECT %s FROM %s JOIN (SELECT c.record_id AS page_id FROM %s c JOIN %s r ON r.id = c.record_id
  WHERE c.consumer = %s AND r.topic = %s AND c.record_id > %s AND %s ORDER BY c.record_id LIMIT %s) page ON id = page.page_id
ORDER BY id`, columns, t, tc, t, p(1), p(2), p(3), cPending, p(4))
	b.recordWait = fmt.Sprintf("SELECT %s FROM %s WHERE id = %s", f.wait("due_at"), t, p(1))
	b.deliveryWait = fmt.Sprintf("SELECT consumer, %s FROM %s WHERE record_id = %s", f.wait("due_at"), tc, p(1))
	b.makeDue = fmt.Sprintf("UPDATE %s SET last_sent_at = %s WHERE id = %s AND %s", t, p(1), p(2), f.pending)
	b.buildActivity(f)
}

// RecordFilter selects the records of one topic that [Operator.Browse]
// lists.
type RecordFilter struct {
	// Topic is the records' topic; required.
	Topic string
	// Consumer, when set, keeps the records in which this consumer's
	// delivery is in State: pending for it (whatever the others'), or
	// abandoned by it (the record pending for others, or abandoned).
	Consumer string
	// State is Pending or Abandoned. Defaults to Pending.
	State State
}

// Browse returns up to limit records of the filter whose id is greater
// than afterID, ordered by id, with their deliveries. It reads through the
// table's indexes only (the topic's pending or abandoned index, the
// consumers table's pending index and primary key), so that a page costs
// the same however many records the table keeps. Completed records are not
// browsed: no index keeps them by topic.
func (o *Operator) Browse(ctx context.Context, f RecordFilter, afterID int64, limit int) ([]recordstore.RecordInfo, error) {
	s := o.s
	if f.State == "" {
		f.State = Pending
	}
	switch {
	case f.Topic == "":
		return nil, fmt.Errorf("%w: browse needs a topic", ErrInvalidConfig)
	case f.State != Pending && f.State != Abandoned:
		return nil, fmt.Errorf("%w: browse lists pending or abandoned records, not %q", ErrInvalidConfig, f.State)
	case limit < 1:
		return nil, fmt.Errorf("%w: limit %d must be positive", ErrInvalidConfig, limit)
	}
	db, d, err := s.bound(ctx)
	if err != nil {
		return nil, err
	}
	b := &s.q.browse
	var infos []recordstore.RecordInfo
	switch {
	case f.Consumer == "":
		infos, err = s.browsePage(ctx, db, b.byTopic[f.State], f.Topic, afterID, limit)
	case f.State == Pending:
		infos, err = s.browsePage(ctx, db, b.byConsumer, f.Consumer, f.Topic, afterID, limit)
	default:
		// A consumer's abandoned delivery is in a pending record (others
		// have still to complete it) or an abandoned one: a page of each,
		// merged by id.
		var other []recordstore.RecordInfo
		if infos, err = s.browsePage(ctx, db, b.abandonedOf[Pending], f.Topic, afterID, f.Consumer, limit); err == nil {
			other, err = s.browsePage(ctx, db, b.abandonedOf[Abandoned], f.Topic, afterID, f.Consumer, limit)
		}
		infos = append(infos, other...)
		slices.SortFunc(infos, func(a, b recordstore.RecordInfo) int { return cmp.Compare(a.ID, b.ID) })
		infos = infos[:min(limit, len(infos))]
	}
	if err != nil {
		return nil, err
	}
	return infos, s.addDeliveries(ctx, db, d, infos)
}

func (s *Store) browsePage(ctx context.Context, db executor, q string, args ...any) ([]recordstore.RecordInfo, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, s.fail("browse", err)
	}
	return s.scanInfos(rows, 0)
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
	if err := db.QueryRowContext(ctx, s.q.browse.recordWait, id).Scan(&wait); err != nil {
		if err == sql.ErrNoRows { //nolint:errorlint // QueryRow returns it unwrapped
			return RetryTimes{}, &TableError{Table: s.table, Op: "retry due", Err: fmt.Errorf("record %d: %w", id, ErrRecordNotFound)}
		}
		return RetryTimes{}, s.fail("retry due", err)
	}
	out := RetryTimes{Record: waitOf(wait)}
	rows, err := db.QueryContext(ctx, s.q.browse.deliveryWait, id)
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
	res, err := db.ExecContext(ctx, s.q.browse.makeDue, dueLongAgo, id)
	if err != nil {
		return false, s.fail("make due", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, s.fail("make due", err)
	}
	return n > 0, nil
}
