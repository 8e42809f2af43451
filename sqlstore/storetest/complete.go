package storetest

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

func (s *contract) testCheckPending(t *testing.T) {
	s.forEachMode(t, func(t *testing.T, mode Completion) {
		store := s.store(t, mode)
		recs := insert(t, store, records("orders", 3))
		pending, completed, deleted := recs[0].ID, recs[1].ID, recs[2].ID
		require.NoError(t, store.Complete(ctx(t), dlv(completed)))
		s.in.Remove(t, store, deleted)

		assert.NoError(t, store.CheckPending(ctx(t), dlv(pending)), "pending")
		assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(completed)), recordstore.ErrNotPending, "completed")
		assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(deleted)), notStored(mode), "deleted")
		assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(neverID)), notStored(mode), "never existed")
	})
}

func (s *contract) testComplete(t *testing.T) {
	t.Run("MarkSetsTheDatabaseClock", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		id := insert(t, store, records("orders", 1))[0].ID
		before := s.in.Now(t, store)
		require.NoError(t, store.Complete(ctx(t), dlv(id)))
		after := s.in.Now(t, store)
		st, found := s.in.Record(t, store, id)
		require.True(t, found, "a marking store keeps the record")
		processed := st.CompletedAt
		assert.True(t, !processed.Before(before) && !processed.After(after),
			"the completion stamp %s comes from the store's clock, between %s and %s", processed, before, after)
		assert.Equal(t, 1, s.rowCount(t, store), "a marking store keeps the row")
	})

	t.Run("DeleteRemovesTheRow", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Delete)
		recs := insert(t, store, records("orders", 2))
		require.NoError(t, store.Complete(ctx(t), dlv(recs[0].ID)))
		rows := s.in.IDs(t, store)
		assert.Equal(t, map[string]int64{recs[1].UUID: recs[1].ID}, rows, "only the completed row is gone")
	})

	t.Run("AgainIsHarmlessAndReported", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, records("orders", 2))
			require.NoError(t, store.Complete(ctx(t), dlv(recs[0].ID)))
			first := s.completedAt(t, store, mode, recs[0].ID)

			assert.ErrorIs(t, store.Complete(ctx(t), dlv(recs[0].ID)), recordstore.ErrNotPending)
			assert.ErrorIs(t, store.Complete(ctx(t), dlv(neverID)), recordstore.ErrNotPending, "never existed")
			assert.Equal(t, first, s.completedAt(t, store, mode, recs[0].ID), "the first completion stands")
			assert.NoError(t, store.CheckPending(ctx(t), dlv(recs[1].ID)), "other records are untouched")
		})
	})

	t.Run("BatchGivesEachDeliveryItsOwnOutcome", func(t *testing.T) {
		// A store that completes a window's deliveries with one call
		// (recordstore.BatchCompleter) answers each as Complete would.
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			bc, ok := store.(recordstore.BatchCompleter)
			if !ok {
				t.Skip("the store completes one delivery per call")
			}
			recs := insert(t, store, records("orders", 4))
			many := insert(t, store, withConsumers(1, twoConsumers...))[0]
			ds := []recordstore.Delivery{
				of(dlv(recs[0].ID), recs[0].UUID),
				dlv(recs[1].ID),
				of(dlv(recs[0].ID), recs[0].UUID),
				of(dlv(recs[2].ID), "another message"),
				dlv(neverID),
				of(dlv(recs[3].ID), unkeptUUIDs[0]),
				consumerDlv(many.ID, "billing"),
			}
			errs := bc.CompleteBatch(ctx(t), ds)
			require.Len(t, errs, len(ds))
			assert.NoError(t, errs[0], "a record's own message")
			assert.NoError(t, errs[1], "a delivery without a UUID")
			assert.ErrorIs(t, errs[2], recordstore.ErrNotPending, "the same delivery again")
			assert.ErrorIs(t, errs[3], recordstore.ErrNotPending, "another message's")
			assert.ErrorIs(t, errs[4], recordstore.ErrNotPending, "never existed")
			if !errors.Is(errs[5], recordstore.ErrInvalidValue) {
				assert.ErrorIs(t, errs[5], recordstore.ErrNotPending, "a UUID no record can have")
			}
			assert.NoError(t, errs[6], "a consumer's delivery")
			s.completedAt(t, store, mode, recs[0].ID)
			s.completedAt(t, store, mode, recs[1].ID)
			assert.NoError(t, store.CheckPending(ctx(t), dlv(recs[2].ID)), "another message's delivery completed nothing")
			assert.NoError(t, store.CheckPending(ctx(t), dlv(recs[3].ID)), "a refused delivery completed nothing")
			assert.ErrorIs(t, store.CheckPending(ctx(t), consumerDlv(many.ID, "billing")), recordstore.ErrNotPending)
			assert.NoError(t, store.CheckPending(ctx(t), consumerDlv(many.ID, "shipping")), "the other consumer's delivery")
		})
	})

	t.Run("ConcurrentCompletionsOneWins", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			id := insert(t, store, records("orders", 1))[0].ID
			const racers = 8
			errs := make([]error, racers)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range racers {
				wg.Go(func() {
					<-start
					errs[i] = store.Complete(ctx(t), dlv(id))
				})
			}
			close(start)
			wg.Wait()
			won := 0
			for _, err := range errs {
				switch {
				case err == nil:
					won++
				case !errors.Is(err, recordstore.ErrNotPending):
					t.Errorf("a losing completion must report ErrNotPending, got %v", err)
				}
			}
			assert.Equal(t, 1, won, "exactly one completion wins")
			assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(id)), recordstore.ErrNotPending)
		})
	})
}
