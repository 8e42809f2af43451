package storetest

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

func (s *contract) testPendingAfter(t *testing.T) {
	t.Run("PagesInIDOrderWithoutGapsOrRepeatsWhileInsertsContinue", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			const rows, batch, page = 3000, 250, 128
			want := map[int64]bool{} // pending records of the topic
			for range rows / batch {
				for i, r := range insert(t, store, records("orders", batch)) {
					if i%7 == 3 {
						require.NoError(t, store.Complete(ctx(t), dlv(r.ID)))
						continue
					}
					want[r.ID] = true
				}
				insert(t, store, records("payments", 10)) // another topic, interleaved
			}

			// Publishers keep inserting while the scan runs.
			done := make(chan struct{})
			var wg sync.WaitGroup
			var late []recordstore.Record
			wg.Go(func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					recs := records("orders", 5)
					if err := store.Insert(ctx(t), recs); err != nil {
						t.Errorf("insert during scan: %v", err)
						return
					}
					late = append(late, recs...)
				}
			})

			seen := map[int64]bool{}
			var after int64
			pages := 0
			for {
				recs, err := store.PendingAfter(ctx(t), "orders", after, page)
				require.NoError(t, err)
				require.LessOrEqual(t, len(recs), page)
				pages++
				for _, r := range recs {
					require.Greater(t, r.ID, after, "ids ascend across and within pages")
					require.False(t, seen[r.ID], "record %d returned twice", r.ID)
					require.Equal(t, "orders", r.Topic)
					seen[r.ID] = true
					after = r.ID
				}
				// Stop once the records that were there before the scan are
				// behind us, while the inserts still run.
				if len(recs) < page || after >= maxID(want) {
					break
				}
			}
			close(done)
			wg.Wait()

			require.Greater(t, pages, rows/page/2, "the scan took many pages")
			for id := range want {
				assert.True(t, seen[id], "pending record %d was skipped", id)
			}
			lateIDs := map[int64]bool{}
			for _, r := range late {
				lateIDs[r.ID] = true
			}
			for id := range seen {
				assert.True(t, want[id] || lateIDs[id], "record %d is neither pending nor inserted during the scan", id)
			}
		})
	})

	t.Run("LimitAndTopic", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			orders := insert(t, store, records("orders", 5))
			insert(t, store, records("orders_eu", 3))
			insert(t, store, records("Orders", 3))

			got, err := store.PendingAfter(ctx(t), "orders", orders[0].ID, 3)
			require.NoError(t, err)
			require.Len(t, got, 3)
			for i, r := range got {
				assert.Equal(t, orders[i+1].ID, r.ID)
			}
			none, err := store.PendingAfter(ctx(t), "orders ", 0, 10)
			require.NoError(t, err)
			assert.Empty(t, none, "topics compare exactly")
		})
	})
}

func maxID(ids map[int64]bool) int64 {
	var m int64
	for id := range ids {
		m = max(m, id)
	}
	return m
}
