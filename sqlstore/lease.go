package sqlstore

import (
	"context"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.Releaser = (*Store)(nil)

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
	if !declares(d) {
		// A declared consumer never claims a record as one without
		// consumers: such a record is adopted (adopt.go).
		n, err := s.exec(ctx, db, "claim", s.q.claimRecord, s.leaseArg, d.Lease, d.ID, d.Topic, d.UUID, d.UUID)
		if err != nil || n == 1 {
			return err
		}
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
	if err := s.decide(st, found, d); err != nil {
		return err
	}
	if st.consumers > 0 {
		n, err := s.exec(ctx, db, "claim", s.q.claimDelivery, s.leaseArg, d.Lease, d.ID, d.Consumer)
		if err != nil || n == 1 {
			return err
		}
	}
	return recordstore.ErrLeased
}

// Release implements [recordstore.Releaser]: it ends the lease of a delivery
// whose handler failed, when d.Lease still holds it, so that its redelivery
// can claim it at once. Without a [Config.Lease] it does nothing.
func (s *Store) Release(ctx context.Context, d recordstore.Delivery) error {
	if s.lease == 0 {
		return nil
	}
	db, err := s.pool()
	if err != nil {
		return err
	}
	n, err := s.exec(ctx, db, "release", s.q.releaseRecord, d.ID, d.Lease)
	if err != nil || n == 1 {
		return err
	}
	_, err = s.exec(ctx, db, "release", s.q.releaseDelivery, d.ID, d.Consumer, d.Lease)
	return err
}
