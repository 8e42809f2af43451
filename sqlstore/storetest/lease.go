package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

func (s *contract) testLease(t *testing.T) {
	s.forEachMode(t, func(t *testing.T, mode Completion) {
		store, releaser := s.leased(t, mode, time.Hour)
		recs := insert(t, store, records("orders", 2))
		id := recs[0].ID

		first, second, third := withLease(dlv(id), "first"), withLease(dlv(id), "second"), withLease(dlv(id), "third")
		require.NoError(t, store.CheckPending(ctx(t), first), "the first delivery claims the record")
		assert.ErrorIs(t, store.CheckPending(ctx(t), second), recordstore.ErrLeased, "a second delivery finds it leased")
		assert.NoError(t, store.CheckPending(ctx(t), withLease(dlv(recs[1].ID), "other")), "the lease is per record")

		require.NoError(t, releaser.Release(ctx(t), second), "releasing with another token is harmless")
		assert.ErrorIs(t, store.CheckPending(ctx(t), third), recordstore.ErrLeased, "and does not release the claim")
		require.NoError(t, releaser.Release(ctx(t), first))
		require.NoError(t, store.CheckPending(ctx(t), second), "a released record can be claimed again")

		require.NoError(t, store.Complete(ctx(t), second), "the lease holder completes")
		assert.ErrorIs(t, store.CheckPending(ctx(t), third), recordstore.ErrNotPending, "a completed record is not pending, leased or not")
		assert.ErrorIs(t, store.CheckPending(ctx(t), withLease(dlv(neverID), "never")), notStored(mode))
		require.NoError(t, releaser.Release(ctx(t), second), "releasing a completed record is harmless")
	})

	t.Run("ExpiresByTheDatabaseClock", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			const lease = 300 * time.Millisecond
			store, _ := s.leased(t, mode, lease)
			id := insert(t, store, records("orders", 1))[0].ID
			claimed := s.in.Now(t, store)
			require.NoError(t, store.CheckPending(ctx(t), withLease(dlv(id), "crashed")), "a delivery claims the record and then crashes")
			require.ErrorIs(t, store.CheckPending(ctx(t), withLease(dlv(id), "copy")), recordstore.ErrLeased)

			// Polls the claim: the lease runs out by the store's clock.
			var err error
			require.Eventually(t, func() bool {
				err = store.CheckPending(ctx(t), withLease(dlv(id), "copy"))
				return err == nil
			}, 20*time.Second, 20*time.Millisecond, "the lease never ran out: %v", err)
			reclaimed := s.in.Now(t, store)
			assert.GreaterOrEqual(t, reclaimed.Sub(claimed), lease-time.Millisecond,
				"claimed again at %s, the lease of %s from %s had not run out", reclaimed, lease, claimed)
		})
	})

	t.Run("NoLeaseNeverReportsLeased", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		id := insert(t, store, records("orders", 1))[0].ID
		require.NoError(t, store.CheckPending(ctx(t), dlv(id)))
		require.NoError(t, store.CheckPending(ctx(t), dlv(id)), "without a lease copies are not refused")
		if releaser, ok := store.(recordstore.Releaser); ok {
			require.NoError(t, releaser.Release(ctx(t), dlv(id)))
		}
	})
}
