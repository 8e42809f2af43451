package sqlstore

// The check of an ordered delivery (recordstore.Delivery.Ordered): the
// record's state and, in the same statement, the earliest earlier record
// of its key that is not complete for the consumer. A delivery without
// Ordered never comes here.

import (
	"context"
	"errors"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// checkOrdered is CheckPending of an ordered delivery, one at a time.
func (s *Store) checkOrdered(ctx context.Context, db *sqlx.DB, d recordstore.Delivery) error {
	st, found, err := s.readOrderedState(ctx, db, d)
	if err != nil {
		return err
	}
	if lacksDelivery(st, found, d) {
		if st, found, err = s.adoptNow(ctx, db, d); err != nil {
			return err
		}
	}
	return s.decideOrdered(st, found, d)
}

// readOrderedState is readState of an ordered delivery. The ordered check
// is the statement SQLite parses longest, and it runs again for every held
// copy: it is kept prepared.
func (s *Store) readOrderedState(ctx context.Context, db executor, d recordstore.Delivery) (recordState, bool, error) {
	query, args := s.orderedStateQuery(d)
	return s.stateOf(scanState(s.queryRow(ctx, db, query, args...), true))
}

// decideOrdered is decide's verdict, where a record that would run (or
// wait for its next attempt) is held while an earlier record of its key
// is not complete for the consumer.
func (s *Store) decideOrdered(st recordState, found bool, d recordstore.Delivery) error {
	err := s.decide(st, found, d)
	var notDue *recordstore.NotDueError
	if err == nil || errors.As(err, &notDue) {
		if h := held(d.ID, st.heldBy); h != nil {
			return h
		}
	}
	return err
}
