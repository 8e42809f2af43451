package storetest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// keyedRecords builds records of "orders" with the origins, "" for none.
func keyedRecords(origins ...string) []recordstore.Record {
	recs := records("orders", len(origins))
	for i, o := range origins {
		recs[i].Origin = o
	}
	return recs
}

// requireSaved checks that r carries the saved record: its id, UUID,
// payload and metadata.
func requireSaved(t testing.TB, saved, r recordstore.Record) {
	t.Helper()
	require.Equal(t, saved.ID, r.ID, "the saved record's id")
	assert.Equal(t, saved.UUID, r.UUID, "the saved record's UUID")
	assert.Equal(t, saved.Payload, r.Payload, "the saved record's payload")
	assert.Equal(t, saved.Metadata, r.Metadata, "the saved record's metadata")
}

// testOrigin is the contract of Record.Origin: a store saves at most one
// record per origin, and hands a second insert the saved record.
func (s *contract) testOrigin(t *testing.T) {
	t.Run("SecondInsertGetsTheSavedRecordAndSavesNothing", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			first := insert(t, store, keyedRecords("delivery-1/orders/0"))[0]
			again := insert(t, store, keyedRecords("delivery-1/orders/0"))[0]
			requireSaved(t, first, again)
			assert.Equal(t, map[string]int64{first.UUID: first.ID}, s.in.IDs(t, store), "nothing saved for the second insert")
		})
	})

	t.Run("DifferentOriginsAreBothSaved", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			a := insert(t, store, keyedRecords("delivery-1/orders/0"))[0]
			b := insert(t, store, keyedRecords("delivery-1/orders/1"))[0]
			assert.Greater(t, b.ID, a.ID)
			assert.Equal(t, map[string]int64{a.UUID: a.ID, b.UUID: b.ID}, s.in.IDs(t, store))
		})
	})

	t.Run("KeyedAndUnkeyedInOneBatch", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			saved := insert(t, store, keyedRecords("o/0"))[0]
			batch := insert(t, store, keyedRecords("", "o/0", "o/1", "", "o/1"))
			requireSaved(t, saved, batch[1])
			requireSaved(t, batch[2], batch[4])
			assert.Less(t, batch[0].ID, batch[2].ID, "new rows get ids in the order of the batch")
			assert.Less(t, batch[2].ID, batch[3].ID, "new rows get ids in the order of the batch")
			assert.Equal(t, map[string]int64{saved.UUID: saved.ID, batch[0].UUID: batch[0].ID, batch[2].UUID: batch[2].ID, batch[3].UUID: batch[3].ID},
				s.in.IDs(t, store), "one row per origin, and one per record without")
		})
	})

	t.Run("OriginOfACompletedRecordIsKeptWhileTheRecordIs", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			first := insert(t, store, keyedRecords("o/0"))[0]
			require.NoError(t, store.Complete(ctx(t), dlv(first.ID)))
			again := insert(t, store, keyedRecords("o/0"))[0]
			if mode == Mark {
				requireSaved(t, first, again)
				assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(again.ID)), recordstore.ErrNotPending, "the saved record stays completed")
				return
			}
			assert.Greater(t, again.ID, first.ID, "a deleting store forgets the origin with the record")
			assert.NoError(t, store.CheckPending(ctx(t), dlv(again.ID)))
		})
	})

	t.Run("SavedRecordKeepsItsDeliveries", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := keyedRecords("o/0")
			recs[0].Consumers = twoConsumers
			first := insert(t, store, recs)[0]
			require.NoError(t, store.Complete(ctx(t), consumerDlv(first.ID, "billing")))
			recs = keyedRecords("o/0")
			recs[0].Consumers = twoConsumers
			again := insert(t, store, recs)[0]
			requireSaved(t, first, again)
			assert.Equal(t, 2, s.deliveryRows(t, store, first.ID), "no deliveries saved for the second insert")
			assert.ErrorIs(t, store.CheckPending(ctx(t), consumerDlv(first.ID, "billing")), recordstore.ErrNotPending, "the completed delivery stays completed")
			assert.NoError(t, store.CheckPending(ctx(t), consumerDlv(first.ID, "shipping")))
		})
	})

	t.Run("ConcurrentPublishersInsertingTwiceSaveOncePerOrigin", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			const publishers, batches = 8, 10
			var mu sync.Mutex
			firsts := map[string]recordstore.Record{} // by origin, and by UUID for records without
			var wg sync.WaitGroup
			for p := range publishers {
				wg.Go(func() {
					for b := range batches {
						origin := func(i int) string {
							if i%2 == 1 {
								return ""
							}
							return fmt.Sprintf("p%d/b%d/%d", p, b, i)
						}
						// The same batch twice, as a rerun makes it: new
						// UUIDs, the same origins.
						for run := range 2 {
							recs := keyedRecords(origin(0), origin(1), origin(2))
							if err := store.Insert(ctx(t), recs); err != nil {
								t.Errorf("publisher %d: %v", p, err)
								return
							}
							mu.Lock()
							for _, r := range recs {
								key := r.Origin
								if key == "" {
									key = r.UUID
								}
								if run == 0 || r.Origin == "" {
									firsts[key] = r
								} else if r.ID != firsts[key].ID || r.UUID != firsts[key].UUID {
									t.Errorf("origin %s: the second insert got record %d %s, the first %d %s", key, r.ID, r.UUID, firsts[key].ID, firsts[key].UUID)
								}
							}
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			want := make(map[string]int64, len(firsts))
			for _, r := range firsts {
				want[r.UUID] = r.ID
			}
			assert.Equal(t, want, s.in.IDs(t, store), "one row per origin, and one per record without")
		})
	})
}

// testInsertTxOrigin: InsertTx keys records as Insert does, and a rolled
// back insert leaves its origins free.
func (s *suite) testInsertTxOrigin(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
		store := s.store(t, mode)
		saved := insert(t, store, keyedRecords("o/0"))[0]

		tx, err := store.DB().BeginTxx(ctx(t), nil)
		require.NoError(t, err)
		rolledBack := keyedRecords("o/1")
		require.NoError(t, store.InsertTx(ctx(t), tx, rolledBack))
		require.NoError(t, tx.Rollback())

		tx, err = store.DB().BeginTxx(ctx(t), nil)
		require.NoError(t, err)
		batch := keyedRecords("o/0", "", "o/1", "o/1")
		require.NoError(t, store.InsertTx(ctx(t), tx, batch))
		require.NoError(t, tx.Commit())

		requireSaved(t, saved, batch[0])
		assert.NotEqual(t, rolledBack[0].ID, batch[2].ID, "the rolled-back record left its origin free")
		requireSaved(t, batch[2], batch[3])
		assert.Equal(t, map[string]int64{saved.UUID: saved.ID, batch[1].UUID: batch[1].ID, batch[2].UUID: batch[2].ID}, rowIDs(t, store))
	})
}
