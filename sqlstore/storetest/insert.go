package storetest

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func (s *contract) testInsert(t *testing.T) {
	t.Run("BatchIDsAreTheRowsIDsInOrder", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, records("orders", 50))
			for i := 1; i < len(recs); i++ {
				assert.Greater(t, recs[i].ID, recs[i-1].ID, "ids follow the order of the batch")
			}
			rows := s.in.IDs(t, store)
			require.Len(t, rows, len(recs))
			for _, r := range recs {
				assert.Equal(t, rows[r.UUID], r.ID, "record %s carries the id of its own row", r.UUID)
			}
		})
	})

	t.Run("ConcurrentPublishersGetTheirOwnRowsIDs", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			const publishers, batches = 8, 15
			var mu sync.Mutex
			var all []recordstore.Record
			var wg sync.WaitGroup
			for p := range publishers {
				wg.Go(func() {
					rnd := rand.New(rand.NewPCG(uint64(p), 1))
					for range batches {
						recs := records("orders", 1+rnd.IntN(40))
						if err := store.Insert(ctx(t), recs); err != nil {
							t.Errorf("publisher %d: %v", p, err)
							return
						}
						mu.Lock()
						all = append(all, recs...)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			rows := s.in.IDs(t, store)
			require.Len(t, rows, len(all))
			seen := make(map[int64]bool, len(all))
			for _, r := range all {
				assert.Equal(t, rows[r.UUID], r.ID, "record %s carries the id of its own row", r.UUID)
				assert.False(t, seen[r.ID], "id %d handed out twice", r.ID)
				seen[r.ID] = true
			}
		})
	})

	t.Run("EmptyBatchDoesNothing", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			require.NoError(t, store.Insert(ctx(t), nil))
			assert.Zero(t, s.rowCount(t, store))
		})
	})
}

// testInsert runs the insert tests that need a table.
func (s *suite) testInsert(t *testing.T) {
	t.Run("RefusedRecordSavesNothing", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			recs := records("orders", 3)
			recs[2].Metadata = map[string]string{"bad": "\xff\xfe"}
			err := store.Insert(ctx(t), recs)
			require.ErrorIs(t, err, sqlstore.ErrInvalidRecord)
			assert.Zero(t, rowCount(t, store), "a batch is saved whole or not at all")
		})
	})

	t.Run("MissingTableNamesTableAndRemedy", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.bare(t, mode)
			err := store.Insert(ctx(t), records("orders", 2))
			require.ErrorIs(t, err, sqlstore.ErrTableMissing)
			assert.Contains(t, err.Error(), store.Table())
			assert.Contains(t, err.Error(), "Store.Migrate")
			err = store.CheckPending(ctx(t), dlv(1))
			require.ErrorIs(t, err, sqlstore.ErrTableMissing, "a missing table is not a record that is not pending")
			assert.Contains(t, err.Error(), store.Table())
		})
	})
}
