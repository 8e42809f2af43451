package sqlstore

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/wmoutbox/outbox"
)

var _ outbox.Releaser = (*Store)(nil)

// claim takes the delivery lease of a pending record with one conditional
// UPDATE on the database clock, so that of two concurrent claims exactly one
// changes the row. A miss costs a second query, to tell a record that is not
// pending (ack the copy) from one leased by another delivery (nack it).
func (s *Store) claim(ctx context.Context, db *sqlx.DB, id int64) error {
	n, err := s.exec(ctx, db, "claim", s.q.claim, s.dialect.leaseArg(s.lease), id)
	if err != nil {
		return err
	}
	if n == 1 {
		return nil
	}
	if err := s.checkPending(ctx, db, id); err != nil {
		return err
	}
	return outbox.ErrLeased
}

// Release implements [outbox.Releaser]: it ends the lease of a record whose
// handler failed, so that its redelivery can claim it at once. Without a
// [Config.Lease] it does nothing.
func (s *Store) Release(ctx context.Context, id int64) error {
	if s.lease == 0 {
		return nil
	}
	db, err := s.pool()
	if err != nil {
		return err
	}
	_, err = s.exec(ctx, db, "release", s.q.release, id)
	return err
}
