package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// clockLayout parses what Features.Now returns.
const clockLayout = "2006-01-02 15:04:05.999999999"

// leased returns a store with a delivery lease on a fresh, migrated table.
func (s *suite) leased(t *testing.T, mode sqlstore.Completion, lease time.Duration) *sqlstore.Store {
	t.Helper()
	store := s.newStore(t, sqlstore.Config{Table: s.bare(t, mode).Table() + "l", Completion: mode, Lease: lease})
	require.NoError(t, store.Migrate(ctx(t)))
	return store
}

func (s *suite) testLease(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
		store := s.leased(t, mode, time.Hour)
		recs := insert(t, store, records("orders", 2))
		id := recs[0].ID

		first, second, third := withLease(dlv(id), "first"), withLease(dlv(id), "second"), withLease(dlv(id), "third")
		require.NoError(t, store.CheckPending(ctx(t), first), "the first delivery claims the record")
		assert.ErrorIs(t, store.CheckPending(ctx(t), second), recordstore.ErrLeased, "a second delivery finds it leased")
		assert.NoError(t, store.CheckPending(ctx(t), withLease(dlv(recs[1].ID), "other")), "the lease is per record")

		require.NoError(t, store.Release(ctx(t), second), "releasing with another token is harmless")
		assert.ErrorIs(t, store.CheckPending(ctx(t), third), recordstore.ErrLeased, "and does not release the claim")
		require.NoError(t, store.Release(ctx(t), first))
		require.NoError(t, store.CheckPending(ctx(t), second), "a released record can be claimed again")

		require.NoError(t, store.Complete(ctx(t), second), "the lease holder completes")
		assert.ErrorIs(t, store.CheckPending(ctx(t), third), recordstore.ErrNotPending, "a completed record is not pending, leased or not")
		assert.ErrorIs(t, store.CheckPending(ctx(t), withLease(dlv(neverID), "never")), notStored(mode))
		require.NoError(t, store.Release(ctx(t), second), "releasing a completed record is harmless")
	})

	t.Run("ExpiresByTheDatabaseClock", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			const lease = 300 * time.Millisecond
			store := s.leased(t, mode, lease)
			id := insert(t, store, records("orders", 1))[0].ID
			db := store.DB()
			var claimedAt string
			require.NoError(t, db.GetContext(ctx(t), &claimedAt, s.f.Now))
			require.NoError(t, store.CheckPending(ctx(t), withLease(dlv(id), "crashed")), "a delivery claims the record and then crashes")
			require.ErrorIs(t, store.CheckPending(ctx(t), withLease(dlv(id), "copy")), recordstore.ErrLeased)

			// Polls the claim: the lease runs out by the database clock.
			var err error
			require.Eventually(t, func() bool {
				err = store.CheckPending(ctx(t), withLease(dlv(id), "copy"))
				return err == nil
			}, 20*time.Second, 20*time.Millisecond, "the lease never ran out: %v", err)
			var reclaimedAt string
			require.NoError(t, db.GetContext(ctx(t), &reclaimedAt, s.f.Now))
			claimed, err1 := time.Parse(clockLayout, claimedAt)
			reclaimed, err2 := time.Parse(clockLayout, reclaimedAt)
			require.NoError(t, err1)
			require.NoError(t, err2)
			assert.GreaterOrEqual(t, reclaimed.Sub(claimed), lease-time.Millisecond,
				"claimed again at %s, the lease of %s from %s had not run out", reclaimedAt, lease, claimedAt)
		})
	})

	t.Run("NoLeaseNeverReportsLeased", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		id := insert(t, store, records("orders", 1))[0].ID
		require.NoError(t, store.CheckPending(ctx(t), dlv(id)))
		require.NoError(t, store.CheckPending(ctx(t), dlv(id)), "without a lease copies are not refused")
		require.NoError(t, store.Release(ctx(t), dlv(id)))
	})
}

// withLease is d with a lease token of its own.
func withLease(d recordstore.Delivery, token string) recordstore.Delivery {
	d.Lease = token
	return d
}

// notStored is what CheckPending reports for an id the table does not
// hold: a marking table keeps completed records, so the record is unknown;
// a deleting table cannot tell it from a completed one.
func notStored(mode sqlstore.Completion) error {
	if mode == sqlstore.Mark {
		return recordstore.ErrUnknownRecord
	}
	return recordstore.ErrNotPending
}
