package sqlstore

// CheckPending: whether a delivery is pending, with or without a lease.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// CheckPending implements [recordstore.Store] with one query in the common case:
// it reads the record and the consumer's delivery row together and decides
// from them. On PostgreSQL, concurrent calls are combined into one query as
// [Coalescing] says; each gets its own verdict. With a [Config.Lease] it claims the record, or the consumer's
// delivery, returning [recordstore.ErrLeased] while another delivery holds it;
// see claim. A delivery with a value the table cannot keep is refused before
// any statement is sent (see values.go).
func (s *Store) CheckPending(ctx context.Context, d recordstore.Delivery) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	if err := s.refuses("check pending", d, false); err != nil {
		return err
	}
	if s.lease > 0 {
		return s.claim(ctx, db, d)
	}
	if d.Ordered {
		return s.checkOrdered(ctx, db, d)
	}
	if s.checks != nil {
		return s.checks.do(ctx, d, 1)
	}
	return s.checkPending(ctx, db, d)
}

// checkNow checks one delivery (the coalescer's single path).
func (s *Store) checkNow(ctx context.Context, d recordstore.Delivery) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	return s.checkPending(ctx, db, d)
}

// checkPending reads whether the record is pending for d's consumer.
func (s *Store) checkPending(ctx context.Context, db *sqlx.DB, d recordstore.Delivery) error {
	st, found, err := s.readState(ctx, db, d)
	if err != nil {
		return err
	}
	if lacksDelivery(st, found, d) {
		if st, found, err = s.adoptNow(ctx, db, d); err != nil {
			return err
		}
	}
	return s.decide(st, found, d)
}

// decide is CheckPending's verdict on a record's state; see
// [recordstore.Store.CheckPending].
func (s *Store) decide(st recordState, found bool, d recordstore.Delivery) error {
	switch {
	case !found && !s.q.mark:
		// A deleting table keeps no completed records.
		return recordstore.ErrNotPending
	case !found || st.topic != d.Topic:
		return fmt.Errorf("sqlstore: table %q has no record %d of topic %q: %w", s.table, d.ID, d.Topic, recordstore.ErrUnknownRecord)
	case d.UUID != "" && st.uuid != d.UUID:
		return fmt.Errorf("sqlstore: record %d of table %q was saved for another message than %q: %w", d.ID, s.table, d.UUID, recordstore.ErrMessageMismatch)
	case st.consumers > 0:
		switch {
		case !st.hasDelivery && declares(d):
			// Not adopted: the record was complete before its topic
			// declared this consumer.
			return recordstore.ErrNotPending
		case !st.hasDelivery:
			return fmt.Errorf("sqlstore: record %d of table %q has no delivery for consumer %q: %w", d.ID, s.table, d.Consumer, recordstore.ErrNoDelivery)
		case st.deliveryCompleted || st.deliveryAbandoned:
			return recordstore.ErrNotPending
		}
		return notDue(d.ID, st.deliveryWaitMicros)
	case st.abandoned:
		return recordstore.ErrNotPending
	case st.completed:
		if d.Consumer == "" || st.completedBy == "" || st.completedBy == d.Consumer || declares(d) {
			return recordstore.ErrNotPending
		}
		return &recordstore.ConsumerConflictError{ID: d.ID, Consumer: d.Consumer, CompletedBy: st.completedBy}
	}
	return notDue(d.ID, st.wait)
}

// notDue is nil when the delivery is due, a [*recordstore.NotDueError]
// otherwise.
func notDue(id int64, waitMicros sql.NullInt64) error {
	if !waitMicros.Valid {
		return nil
	}
	return &recordstore.NotDueError{ID: id, Wait: max(time.Duration(waitMicros.Int64)*time.Microsecond, time.Microsecond)}
}

// recordState is what q.state reads: the record's row and the delivery
// row of one consumer.
type recordState struct {
	topic       string
	uuid        string // the message the record was saved for
	consumers   int
	completed   bool // a marking table's processed_at is set
	completedBy string
	abandoned   bool
	wait        sql.NullInt64 // microseconds until due, when not due
	// The consumer's delivery row, when the record has one.
	hasDelivery        bool
	deliveryCompleted  bool
	deliveryAbandoned  bool
	deliveryWaitMicros sql.NullInt64
	// heldBy is read for ordered deliveries only (order.go).
	heldBy sql.NullInt64
}

// readState reads the record of d and its delivery row for d's consumer;
// false when there is no record with the id. An ordered delivery reads
// whether an earlier record holds it too (readOrderedState).
func (s *Store) readState(ctx context.Context, db executor, d recordstore.Delivery) (recordState, bool, error) {
	if d.Ordered {
		return s.readOrderedState(ctx, db, d)
	}
	return s.stateOf(scanState(db.QueryRowContext(ctx, s.q.state, d.Consumer, d.ID), false))
}

// stateOf is a state read's outcome: false, without an error, when the
// record does not exist.
func (s *Store) stateOf(st recordState, err error) (recordState, bool, error) {
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return st, false, nil
	case err != nil:
		return st, false, s.fail("check pending", err)
	}
	return st, true, nil
}

// scanState scans the columns of q.state (and heldBy, when ordered), after
// the leading ones of the row, if any (stateMany's id and consumer).
func scanState(row interface{ Scan(...any) error }, ordered bool, leading ...any) (recordState, error) {
	var st recordState
	var completed, abandoned, has, dCompleted, dAbandoned int
	dest := append(leading, &st.topic, &st.uuid, &st.consumers, &completed, &st.completedBy, &abandoned, &st.wait,
		&has, &dCompleted, &dAbandoned, &st.deliveryWaitMicros)
	if ordered {
		dest = append(dest, &st.heldBy)
	}
	if err := row.Scan(dest...); err != nil {
		return st, err
	}
	st.completed, st.abandoned = completed == 1, abandoned == 1
	st.hasDelivery, st.deliveryCompleted, st.deliveryAbandoned = has == 1, dCompleted == 1, dAbandoned == 1
	return st, nil
}

// checkBatch reads the state of every call's delivery with one query and
// gives each call CheckPending's verdict on it.
func (s *Store) checkBatch(ctx context.Context, batch []*call[recordstore.Delivery]) {
	db, err := s.pool()
	if err == nil {
		err = s.readStates(ctx, db, batch)
	}
	if err != nil {
		for _, c := range batch {
			c.err = err
		}
	}
}

// readStates runs q.stateMany for the batch and sets each call's verdict.
func (s *Store) readStates(ctx context.Context, db *sqlx.DB, batch []*call[recordstore.Delivery]) error {
	ids := make([]int64, len(batch))
	consumers := make([]string, len(batch))
	for i, c := range batch {
		ids[i], consumers[i] = c.arg.ID, c.arg.Consumer
	}
	rows, err := db.QueryContext(ctx, s.q.stateMany, ids, consumers)
	if err != nil && len(batch) > 1 && s.dialect.invalidValue(err) {
		// One call's value, refused by the database: each call alone,
		// so that only that one is.
		for _, c := range batch {
			c.err = s.checkPending(c.ctx, db, c.arg)
		}
		return nil
	}
	if err != nil {
		return s.fail("check pending", err)
	}
	defer rows.Close()
	type key struct {
		id       int64
		consumer string
	}
	states := make(map[key]recordState, len(batch))
	for rows.Next() {
		var k key
		st, err := scanState(rows, false, &k.id, &k.consumer)
		if err != nil {
			return s.fail("check pending", err)
		}
		states[k] = st
	}
	if err := rows.Err(); err != nil {
		return s.fail("check pending", err)
	}
	for _, c := range batch {
		st, found := states[key{c.arg.ID, c.arg.Consumer}]
		if lacksDelivery(st, found, c.arg) {
			// Adopted on the single path, which reads the state again.
			c.err = s.checkPending(c.ctx, db, c.arg)
			continue
		}
		c.err = s.decide(st, found, c.arg)
	}
	return nil
}

// claim takes the delivery lease with a conditional UPDATE on the database
// clock, recording d.Lease as its owner, so that of two concurrent claims
// exactly one changes the row. A record without consumers is claimed in one
// round trip, only by the message it was saved for. Otherwise the
// record's state is read, which tells a copy to acknowledge or refuse (or
// another message naming the record) from one to run, and a record with
// consumers has
// the consumer's own delivery row claimed: two consumers hold leases on one
// record at once, two copies for one consumer do not.
func (s *Store) claim(ctx context.Context, db *sqlx.DB, d recordstore.Delivery) error {
	if !declares(d) && !d.Ordered {
		// A declared consumer never claims a record as one without
		// consumers: such a record is adopted (adopt.go). An ordered
		// delivery reads its state, and whether it is held, first.
		n, err := s.exec(ctx, db, "claim", s.q.claimRecord, s.leaseArg, d.Lease, d.ID, d.Topic, d.UUID, d.UUID)
		if err != nil && !errors.Is(err, recordstore.ErrInvalidValue) || n == 1 {
			return err
		}
		// Not claimed; or a value refused, such as the UUID, which the
		// state read next compares without sending it.
	}
	st, found, err := s.readState(ctx, db, d)
	if err != nil {
		return err
	}
	if lacksDelivery(st, found, d) {
		if st, found, err = s.adoptNow(ctx, db, d); err != nil {
			return err
		}
	}
	verdict := s.decide
	if d.Ordered {
		verdict = s.decideOrdered
	}
	if err := verdict(st, found, d); err != nil {
		return err
	}
	claim, args := s.q.claimDelivery, []any{s.leaseArg, d.Lease, d.ID, d.Consumer}
	if st.consumers == 0 {
		claim, args = s.q.claimRecord, []any{s.leaseArg, d.Lease, d.ID, d.Topic, d.UUID, d.UUID}
	}
	if st.consumers > 0 || (d.Ordered && !declares(d)) {
		n, err := s.exec(ctx, db, "claim", claim, args...)
		if err != nil || n == 1 {
			return err
		}
	}
	return recordstore.ErrLeased
}

// buildCheck builds the statements of CheckPending and of the lease.
func (q *queries) buildCheck(f fragments) {
	t, tc, p, d := f.t, f.tc, f.p, f.d
	recordDone, completedBy := "0", "''"
	if f.mark {
		recordDone, completedBy = "CASE WHEN r.processed_at IS NULL THEN 0 ELSE 1 END", "COALESCE(r.completed_by, '')"
	}
	columns := fmt.Sprintf(`r.topic, r.uuid, r.consumers, %s, %s, CASE WHEN r.abandoned_at IS NULL THEN 0 ELSE 1 END, %s,
    CASE WHEN c.record_id IS NULL THEN 0 ELSE 1 END, CASE WHEN c.processed_at IS NULL THEN 0 ELSE 1 END,
    CASE WHEN c.abandoned_at IS NULL THEN 0 ELSE 1 END, %s`, recordDone, completedBy, f.wait("r.due_at"), f.wait("c.due_at"))
	q.state = fmt.Sprintf(`SELECT %s
FROM %s r LEFT JOIN %s c ON c.record_id = r.id AND c.consumer = %s
WHERE r.id = %s`, columns, t, tc, p(1), p(2))
	if pairs := d.deliveryPairs; pairs != "" {
		// Each delivery is looked up on its own (LATERAL … LIMIT 1 keeps
		// the planner from turning the lookups into a join): a plan
		// cached while the table was small would otherwise hash-join a
		// scan of the whole table, and keep doing so as it grows.
		q.stateMany = fmt.Sprintf(`SELECT x.id, x.consumer, s.*
FROM %s CROSS JOIN LATERAL (SELECT %s
FROM %s r LEFT JOIN %s c ON c.record_id = r.id AND c.consumer = x.consumer
WHERE r.id = x.id LIMIT 1) AS s`, pairs, columns, t, tc)
	}
	q.buildOrder(f, columns)

	free := fmt.Sprintf("(lease_until IS NULL OR lease_until < %s)", f.clock)
	q.claimRecord = fmt.Sprintf("UPDATE %s SET lease_until = %s, lease_owner = %s WHERE id = %s AND topic = %s AND %s AND consumers = 0 AND %s AND %s AND %s",
		t, d.leaseUntil(1), p(2), p(3), p(4), f.message("uuid", 5), f.pending, f.due("due_at"), free)
	// The topic and the message were checked by the state query that
	// comes first.
	q.claimDelivery = fmt.Sprintf("UPDATE %s SET lease_until = %s, lease_owner = %s WHERE record_id = %s AND consumer = %s AND %s AND %s AND %s",
		tc, d.leaseUntil(1), p(2), p(3), p(4), deliveryPending, f.due("due_at"), free)
	q.releaseRecord = fmt.Sprintf("UPDATE %s SET lease_until = NULL, lease_owner = NULL WHERE id = %s AND lease_owner = %s", t, p(1), p(2))
	q.releaseDelivery = fmt.Sprintf("UPDATE %s SET lease_until = NULL, lease_owner = NULL WHERE record_id = %s AND consumer = %s AND lease_owner = %s",
		tc, p(1), p(2), p(3))
}
