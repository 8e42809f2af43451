package storetest

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// neverID is an id no test table reaches.
const neverID = int64(1) << 60

func (s *suite) testCheckPending(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
		store := s.store(t, mode)
		recs := insert(t, store, records("orders", 3))
		pending, completed, deleted := recs[0].ID, recs[1].ID, recs[2].ID
		require.NoError(t, store.Complete(ctx(t), dlv(completed)))
		_, err := store.DB().ExecContext(ctx(t), store.DB().Rebind("DELETE FROM "+store.Table()+" WHERE id = ?"), deleted)
		require.NoError(t, err)

		assert.NoError(t, store.CheckPending(ctx(t), dlv(pending)), "pending")
		assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(completed)), recordstore.ErrNotPending, "completed")
		assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(deleted)), notStored(mode), "deleted")
		assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(neverID)), notStored(mode), "never existed")
	})
}

func (s *suite) testComplete(t *testing.T) {
	t.Run("MarkSetsTheDatabaseClock", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		id := insert(t, store, records("orders", 1))[0].ID
		db := store.DB()
		var before, after, processed string
		require.NoError(t, db.GetContext(ctx(t), &before, s.f.Now))
		require.NoError(t, store.Complete(ctx(t), dlv(id)))
		require.NoError(t, db.GetContext(ctx(t), &after, s.f.Now))
		require.NoError(t, db.GetContext(ctx(t), &processed, db.Rebind(s.f.ProcessedAt(store.Table())), id))
		assert.True(t, before <= processed && processed <= after,
			"processed_at %s comes from the database clock, between %s and %s", processed, before, after)
		assert.Equal(t, 1, rowCount(t, store), "a marking store keeps the row")
	})

	t.Run("DeleteRemovesTheRow", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Delete)
		recs := insert(t, store, records("orders", 2))
		require.NoError(t, store.Complete(ctx(t), dlv(recs[0].ID)))
		rows := rowIDs(t, store)
		assert.Equal(t, map[string]int64{recs[1].UUID: recs[1].ID}, rows, "only the completed row is gone")
	})

	t.Run("AgainIsHarmlessAndReported", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, records("orders", 2))
			require.NoError(t, store.Complete(ctx(t), dlv(recs[0].ID)))
			first := s.processedAt(t, store, recs[0].ID)

			assert.ErrorIs(t, store.Complete(ctx(t), dlv(recs[0].ID)), recordstore.ErrNotPending)
			assert.ErrorIs(t, store.Complete(ctx(t), dlv(neverID)), recordstore.ErrNotPending, "never existed")
			assert.Equal(t, first, s.processedAt(t, store, recs[0].ID), "the first completion stands")
			assert.NoError(t, store.CheckPending(ctx(t), dlv(recs[1].ID)), "other records are untouched")
		})
	})

	t.Run("ConcurrentCompletionsOneWins", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
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

// processedAt reads processed_at of a marking store's record, or "deleted"
// when the row is gone (a deleting store).
func (s *suite) processedAt(t *testing.T, store *sqlstore.Store, id int64) string {
	t.Helper()
	if store.Completion() == sqlstore.Delete {
		var n int
		require.NoError(t, store.DB().GetContext(ctx(t), &n, store.DB().Rebind("SELECT COUNT(*) FROM "+store.Table()+" WHERE id = ?"), id))
		require.Zero(t, n)
		return "deleted"
	}
	var at string
	require.NoError(t, store.DB().GetContext(ctx(t), &at, store.DB().Rebind(s.f.ProcessedAt(store.Table())), id))
	return at
}
