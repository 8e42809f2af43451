package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
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

		require.NoError(t, store.CheckPending(ctx(t), id), "the first delivery claims the record")
		assert.ErrorIs(t, store.CheckPending(ctx(t), id), outbox.ErrLeased, "a second delivery finds it leased")
		assert.NoError(t, store.CheckPending(ctx(t), recs[1].ID), "the lease is per record")

		require.NoError(t, store.Release(ctx(t), id))
		require.NoError(t, store.CheckPending(ctx(t), id), "a released record can be claimed again")

		require.NoError(t, store.Complete(ctx(t), id), "the lease holder completes")
		assert.ErrorIs(t, store.CheckPending(ctx(t), id), outbox.ErrNotPending, "a completed record is not pending, leased or not")
		assert.ErrorIs(t, store.CheckPending(ctx(t), neverID), outbox.ErrNotPending)
		require.NoError(t, store.Release(ctx(t), id), "releasing a completed record is harmless")
	})

	t.Run("ExpiresByTheDatabaseClock", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			const lease = 300 * time.Millisecond
			store := s.leased(t, mode, lease)
			id := insert(t, store, records("orders", 1))[0].ID
			db := store.DB()
			var claimedAt string
			require.NoError(t, db.GetContext(ctx(t), &claimedAt, s.f.Now))
			require.NoError(t, store.CheckPending(ctx(t), id), "a delivery claims the record and then crashes")
			require.ErrorIs(t, store.CheckPending(ctx(t), id), outbox.ErrLeased)

			// Polls the claim: the lease runs out by the database clock.
			var err error
			require.Eventually(t, func() bool {
				err = store.CheckPending(ctx(t), id)
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
		require.NoError(t, store.CheckPending(ctx(t), id))
		require.NoError(t, store.CheckPending(ctx(t), id), "without a lease copies are not refused")
		require.NoError(t, store.Release(ctx(t), id))
	})
}
