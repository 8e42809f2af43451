package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// A record saved with consumers has one delivery row per consumer in the
// table <table>_consumers, and its own row counts them (consumers > 0). The
// record stays pending until none of its deliveries is: then it is
// completed (marked, or deleted with its delivery rows) when every delivery
// was completed, and abandoned when one was abandoned.
//
// Every write to the deliveries of a record first writes the record's row
// (lockRecord, or a SELECT … FOR UPDATE of it), so that writers of one
// record serialize on it, in the same order, on every database; the one
// that leaves no delivery pending sees every other's completion and rolls
// the record up.

// deliveryChunk bounds the rows of one statement that lists them, well
// within every database's limit on bound parameters.
const deliveryChunk = 500

// declaresConsumers reports whether a record of the batch has consumers.
func declaresConsumers(records []recordstore.Record) bool {
	for _, r := range records {
		if len(r.Consumers) > 0 {
			return true
		}
	}
	return false
}

// distinctConsumers returns the consumers of r once each, in order.
func distinctConsumers(r recordstore.Record) []string {
	out := make([]string, 0, len(r.Consumers))
	for _, c := range r.Consumers {
		dup := false
		for _, o := range out {
			if o == c {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, c)
		}
	}
	return out
}

// insertDeliveries saves one pending delivery per consumer of the records,
// whose ids are set, and records how many each has, through tx.
func (s *Store) insertDeliveries(ctx context.Context, tx executor, records []recordstore.Record) error {
	byCount, err := s.insertDeliveryRows(ctx, tx, records)
	if err != nil {
		return err
	}
	for n, ids := range byCount {
		for start := 0; start < len(ids); start += stampChunk {
			chunk := ids[start:min(start+stampChunk, len(ids))]
			a := make([]any, 0, len(chunk)+1)
			a = append(a, n)
			for _, id := range chunk {
				a = append(a, id)
			}
			if _, err := tx.ExecContext(ctx, s.q.setConsumers+idList(s.dialect, 2, len(chunk)), a...); err != nil {
				return err
			}
		}
	}
	return nil
}

// insertDeliveryRows saves one pending delivery per consumer of the
// records, whose ids are set, through tx, and returns the ids of the
// records with consumers by their number of consumers.
func (s *Store) insertDeliveryRows(ctx context.Context, tx executor, records []recordstore.Record) (map[int][]int64, error) {
	d := s.dialect
	byCount := map[int][]int64{}
	var b strings.Builder
	args := make([]any, 0, 2*deliveryChunk)
	flush := func() error {
		if len(args) == 0 {
			return nil
		}
		_, err := tx.ExecContext(ctx, b.String(), args...)
		b.Reset()
		args = args[:0]
		return err
	}
	for _, r := range records {
		cs := distinctConsumers(r)
		if len(cs) == 0 {
			continue
		}
		byCount[len(cs)] = append(byCount[len(cs)], r.ID)
		for _, c := range cs {
			if len(args) == 0 {
				b.WriteString(s.q.insertDeliveries)
			} else {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "(%s, %s)", d.placeholder(len(args)+1), d.placeholder(len(args)+2))
			args = append(args, r.ID, c)
			if len(args) == 2*deliveryChunk {
				if err := flush(); err != nil {
					return nil, err
				}
			}
		}
	}
	return byCount, flush()
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
}

// readState reads the record of d and its delivery row for d's consumer;
// false when there is no record with the id.
func (s *Store) readState(ctx context.Context, db executor, d recordstore.Delivery) (recordState, bool, error) {
	st, err := scanState(db.QueryRowContext(ctx, s.q.state, d.Consumer, d.ID))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return st, false, nil
	case err != nil:
		return st, false, s.fail("check pending", err)
	}
	return st, true, nil
}

// scanState scans the columns of q.state, after the leading ones of the
// row, if any (stateMany's id and consumer).
func scanState(row interface{ Scan(...any) error }, leading ...any) (recordState, error) {
	var st recordState
	var completed, abandoned, has, dCompleted, dAbandoned int
	dest := append(leading, &st.topic, &st.uuid, &st.consumers, &completed, &st.completedBy, &abandoned, &st.wait,
		&has, &dCompleted, &dAbandoned, &st.deliveryWaitMicros)
	if err := row.Scan(dest...); err != nil {
		return st, err
	}
	st.completed, st.abandoned = completed == 1, abandoned == 1
	st.hasDelivery, st.deliveryCompleted, st.deliveryAbandoned = has == 1, dCompleted == 1, dAbandoned == 1
	return st, nil
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

// completeDeliveryNow completes the delivery of a record with consumers in
// a transaction of its own; ErrNotPending when there is none pending.
func (s *Store) completeDeliveryNow(ctx context.Context, db *sqlx.DB, d recordstore.Delivery) error {
	return s.inTx(ctx, db, "complete", func(tx executor) error { return s.completeDelivery(ctx, tx, d, "complete", s.q.lockRecordAlone) })
}

// completeDelivery locks the record of d with the lock statement (a
// lazy-commit one in a transaction of the store's own), completes d's
// delivery and rolls the record up, through tx. A delivery that is not
// pending, or whose message is not the record's, gets ErrNotPending.
func (s *Store) completeDelivery(ctx context.Context, tx executor, d recordstore.Delivery, op, lock string) error {
	if _, err := tx.ExecContext(ctx, lock, d.ID); err != nil {
		return s.fail(op, err)
	}
	args := []any{d.ID, d.Consumer, d.ID, d.UUID, d.UUID}
	n, err := s.exec(ctx, tx, op, s.q.completeDelivery, args...)
	if err != nil {
		return err
	}
	if n == 0 && declares(d) {
		// A record saved before its topic declared this consumer, unless
		// it was not pending; adopted by a concurrent delivery meanwhile
		// when adopt adds nothing.
		if _, err := s.adopt(ctx, tx, d, op); err != nil {
			return err
		}
		if n, err = s.exec(ctx, tx, op, s.q.completeDelivery, args...); err != nil {
			return err
		}
	}
	if n == 0 {
		return recordstore.ErrNotPending
	}
	return s.rollUp(ctx, tx, d.ID, op)
}

// rollUp completes or abandons the record once none of its deliveries is
// pending. The caller holds the record's lock.
func (s *Store) rollUp(ctx context.Context, tx executor, id int64, op string) error {
	rows, err := tx.QueryContext(ctx, s.q.deliveries, id)
	if err != nil {
		return s.fail(op, err)
	}
	defer rows.Close()
	pending, abandoned := 0, 0
	for rows.Next() {
		var p, a int
		if err := rows.Scan(&p, &a); err != nil {
			return s.fail(op, err)
		}
		pending += p
		abandoned += a
	}
	if err := rows.Err(); err != nil {
		return s.fail(op, err)
	}
	rows.Close()
	switch {
	case pending > 0:
		return nil
	case abandoned > 0:
		_, err = tx.ExecContext(ctx, s.q.abandonRecord, id)
	case s.q.mark:
		_, err = tx.ExecContext(ctx, s.q.finishRecord, id)
	default:
		if _, err = tx.ExecContext(ctx, s.q.dropDeliveries, id); err == nil {
			_, err = tx.ExecContext(ctx, s.q.finishRecord, id)
		}
	}
	if err != nil {
		return s.fail(op, err)
	}
	return nil
}
