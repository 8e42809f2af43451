package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// Adoption: a topic whose consumers are declared while records are pending
// (records saved without consumers, or without one of the consumers it now
// declares) gives each such record, the first time a declared consumer
// checks, completes or fails it, one pending delivery per declared consumer
// it lacks. From then on the record is one with consumers like any other,
// and completes only when every declared consumer completed it. A record
// that was completed before stays complete.
//
// Records saved with a delivery for the consumer, and deliveries of topics
// that declare none, never come here: the decision is made on what the
// check read anyway, or on Delivery.Declared being empty.

// buildAdopt builds the statements of adoption. adoptLock writes the
// record's row first, as every writer of its deliveries does (see
// complete.go); adoptRead reads its consumer count while it is pending;
// adoptHave lists its deliveries; adoptCount sets the new count.
func (q *queries) buildAdopt(f fragments) {
	t, tc, p := f.t, f.tc, f.p
	q.adoptLock = fmt.Sprintf("UPDATE %s SET consumers = consumers WHERE id = %s", t, p(1))
	q.adoptRead = fmt.Sprintf("SELECT consumers FROM %s WHERE id = %s AND topic = %s AND %s", t, p(1), p(2), f.pending)
	q.adoptHave = fmt.Sprintf("SELECT consumer FROM %s WHERE record_id = %s", tc, p(1))
	q.adoptCount = fmt.Sprintf("UPDATE %s SET consumers = %s WHERE id = %s", t, p(1), p(2))
}

// declares reports whether d is the delivery of one of the consumers its
// topic declares now.
func declares(d recordstore.Delivery) bool {
	return len(d.Declared) > 0 && slices.Contains(d.Declared, d.Consumer)
}

// lacksDelivery reports whether the state read for d is that of a pending
// record of d's topic without a delivery for d's consumer, which the topic
// declares: the record is to be adopted before the check decides.
func lacksDelivery(st recordState, found bool, d recordstore.Delivery) bool {
	return (st.consumers == 0 || !st.hasDelivery) && found && declares(d) &&
		st.topic == d.Topic && !st.completed && !st.abandoned
}

// adoptNow adopts d's record in a transaction of its own and reads its
// state again.
func (s *Store) adoptNow(ctx context.Context, db *sqlx.DB, d recordstore.Delivery) (recordState, bool, error) {

	if err := s.inTx(ctx, db, "check pending", func(tx executor) error {
		_, err := s.adopt(ctx, tx, d, "check pending")
		return err
	}); err != nil {
		return recordState{}, false, err
	}
	return s.readState(ctx, db, d)
}

// adopt gives d's record, when it is a pending record of d's topic, a
// pending delivery for each consumer of d.Declared it has none for, through
// tx, and reports whether it added any. It writes the record's row first,
// so that concurrent adoptions, and completions, of one record serialize
// on it and the second sees the first's deliveries.
func (s *Store) adopt(ctx context.Context, tx executor, d recordstore.Delivery, op string) (bool, error) {
	if _, err := tx.ExecContext(ctx, s.q.adoptLock, d.ID); err != nil {
		return false, s.fail(op, err)
	}
	var consumers int
	switch err := tx.QueryRowContext(ctx, s.q.adoptRead, d.ID, d.Topic).Scan(&consumers); {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, s.fail(op, err)
	}
	var have []string
	if consumers > 0 {
		rows, err := tx.QueryContext(ctx, s.q.adoptHave, d.ID)
		if err != nil {
			return false, s.fail(op, err)
		}
		defer rows.Close()
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				return false, s.fail(op, err)
			}
			have = append(have, c)
		}
		if err := rows.Err(); err != nil {
			return false, s.fail(op, err)
		}
		rows.Close()
	}
	var missing []string
	for _, c := range d.Declared {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return false, nil
	}
	if _, err := s.insertDeliveryRows(ctx, tx, []recordstore.Record{{ID: d.ID, Consumers: missing}}); err != nil {
		return false, s.fail(op, err)
	}
	if _, err := tx.ExecContext(ctx, s.q.adoptCount, len(have)+len(missing), d.ID); err != nil {
		return false, s.fail(op, err)
	}
	return true, nil
}
