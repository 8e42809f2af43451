package sqlstore

import (
	"context"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.Releaser = (*Store)(nil)

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
