package storetest

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// longAgo is a timestamp every database reads from the same text and that
// sorts before any clock reading.
const longAgo = "2000-01-01 00:00:00"

// backdate sets a timestamp column of the given records (all when ids is
// empty) to longAgo.
func backdate(t *testing.T, store *sqlstore.Store, column string, ids ...int64) {
	t.Helper()
	q := "UPDATE " + store.Table() + " SET " + column + " = ?"
	args := []any{longAgo}
	if len(ids) > 0 {
		q += " WHERE id IN (?" + strings.Repeat(",?", len(ids)-1) + ")"
		for _, id := range ids {
			args = append(args, id)
		}
	}
	_, err := store.DB().ExecContext(ctx(t), store.DB().Rebind(q), args...)
	require.NoError(t, err)
}

func claimedIDs(recs []recordstore.Record) []int64 {
	ids := make([]int64, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ids
}

func (s *suite) testAttempts(t *testing.T) {
	t.Run("FailuresCountThenAbandonAndResubmit", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, records("orders", 2))
			id := recs[0].ID

			for want := 1; want <= 2; want++ {
				n, abandoned, err := store.RecordFailure(ctx(t), dlv(id), "boom", 3, nil)
				require.NoError(t, err)
				assert.Equal(t, want, n)
				assert.False(t, abandoned)
				require.NoError(t, store.CheckPending(ctx(t), dlv(id)), "a failed record stays pending")
			}
			n, abandoned, err := store.RecordFailure(ctx(t), dlv(id), "last boom", 3, nil)
			require.NoError(t, err)
			assert.Equal(t, 3, n)
			assert.True(t, abandoned, "the third failure of three abandons")

			assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(id)), recordstore.ErrNotPending, "an abandoned record is not pending")
			pending, err := store.PendingAfter(ctx(t), "orders", 0, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{recs[1].ID}, claimedIDs(pending), "replay skips the abandoned record")
			assert.Equal(t, 2, rowCount(t, store), "the abandoned record is kept")
			_, _, err = store.RecordFailure(ctx(t), dlv(id), "again", 3, nil)
			assert.ErrorIs(t, err, recordstore.ErrNotPending)

			var lastError string
			require.NoError(t, store.DB().GetContext(ctx(t), &lastError, store.DB().Rebind("SELECT last_error FROM "+store.Table()+" WHERE id = ?"), id))
			assert.Equal(t, "last boom", lastError)

			_, err = store.Requeue(ctx(t), recs[1].ID)
			assert.ErrorIs(t, err, recordstore.ErrNotAbandoned, "a pending record is not resubmitted")
			got, err := store.Requeue(ctx(t), id)
			require.NoError(t, err)
			assert.Equal(t, recs[0].UUID, got.UUID)
			assert.Equal(t, recs[0].Payload, got.Payload)
			assert.Equal(t, "orders", got.Topic)
			require.NoError(t, store.CheckPending(ctx(t), dlv(id)), "a resubmitted record is pending again")
			n, abandoned, err = store.RecordFailure(ctx(t), dlv(id), "after resubmit", 3, nil)
			require.NoError(t, err)
			assert.Equal(t, 1, n, "resubmitting resets the attempts")
			assert.False(t, abandoned)
		})
	})

	t.Run("ZeroMaxAttemptsNeverAbandons", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		id := insert(t, store, records("orders", 1))[0].ID
		for range 5 {
			_, abandoned, err := store.RecordFailure(ctx(t), dlv(id), "boom", 0, nil)
			require.NoError(t, err)
			require.False(t, abandoned)
		}
		require.NoError(t, store.CheckPending(ctx(t), dlv(id)))
	})

	t.Run("ErrorTextIsBounded", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		id := insert(t, store, records("orders", 1))[0].ID
		long := strings.Repeat("é", sqlstore.MaxErrorLength) // two bytes each
		_, _, err := store.RecordFailure(ctx(t), dlv(id), long, 0, nil)
		require.NoError(t, err)
		var kept string
		require.NoError(t, store.DB().GetContext(ctx(t), &kept, store.DB().Rebind("SELECT last_error FROM "+store.Table()+" WHERE id = ?"), id))
		assert.Len(t, kept, sqlstore.MaxErrorLength)
		assert.Equal(t, long[:sqlstore.MaxErrorLength], kept)
	})

	t.Run("CompletedRecordIsNotCounted", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			id := insert(t, store, records("orders", 1))[0].ID
			require.NoError(t, store.Complete(ctx(t), dlv(id)))
			_, _, err := store.RecordFailure(ctx(t), dlv(id), "late", 1, nil)
			assert.ErrorIs(t, err, recordstore.ErrNotPending)
		})
	})
}

func (s *suite) testClaimStale(t *testing.T) {
	t.Run("ByLastSendAndRestamps", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, records("orders", 3))
			insert(t, store, records("other", 1))
			a, b, c := recs[0].ID, recs[1].ID, recs[2].ID

			got, err := store.ClaimStale(ctx(t), "orders", time.Hour, 10)
			require.NoError(t, err)
			assert.Empty(t, got, "records just sent are not stale")

			backdate(t, store, "created_at", a, b)
			got, err = store.ClaimStale(ctx(t), "orders", time.Hour, 1)
			require.NoError(t, err)
			assert.Equal(t, []int64{a}, claimedIDs(got), "oldest first, limit kept")
			assert.Equal(t, recs[0].UUID, got[0].UUID)
			assert.Equal(t, recs[0].Metadata, got[0].Metadata)
			got, err = store.ClaimStale(ctx(t), "orders", time.Hour, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{b}, claimedIDs(got), "a claimed record counts as sent now")

			require.NoError(t, store.Complete(ctx(t), dlv(b)))
			backdate(t, store, "created_at")
			backdate(t, store, "last_sent_at")
			got, err = store.ClaimStale(ctx(t), "orders", time.Hour, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{a, c}, claimedIDs(got), "completed records and other topics are not claimed")
		})
	})

	t.Run("ConcurrentClaimsNeverShareARecord", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		recs := insert(t, store, records("orders", 60))
		backdate(t, store, "created_at")
		var mu sync.Mutex
		seen := map[int64]int{}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					got, err := store.ClaimStale(ctx(t), "orders", time.Hour, 5)
					if !assert.NoError(t, err) || len(got) == 0 {
						return
					}
					mu.Lock()
					for _, r := range got {
						seen[r.ID]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		require.Len(t, seen, len(recs), "every stale record is claimed")
		for id, n := range seen {
			assert.Equal(t, 1, n, "record %d claimed once", id)
		}
	})

	t.Run("StampSentCountsAsASend", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		recs := insert(t, store, records("orders", 1201))
		backdate(t, store, "created_at")
		ids := claimedIDs(recs)
		require.NoError(t, store.StampSent(ctx(t), ids[:1200]))
		got, err := store.ClaimStale(ctx(t), "orders", time.Hour, 10)
		require.NoError(t, err)
		assert.Equal(t, ids[1200:], claimedIDs(got), "every stamped record, across chunks, counts as just sent")
	})

	t.Run("BadArgumentsAreRefused", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		_, err := store.ClaimStale(ctx(t), "orders", 0, 10)
		assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
		_, err = store.ClaimStale(ctx(t), "orders", time.Hour, 0)
		assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
	})
}

func (s *suite) testPurge(t *testing.T) {
	t.Run("DeletesOldCompletedInBatches", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		recs := insert(t, store, records("orders", 5))
		for _, r := range recs[:3] {
			require.NoError(t, store.Complete(ctx(t), dlv(r.ID)))
		}
		_, abandoned, err := store.RecordFailure(ctx(t), dlv(recs[3].ID), "poison", 1, nil)
		require.NoError(t, err)
		require.True(t, abandoned)

		n, err := store.Clean(ctx(t), time.Hour, 10)
		require.NoError(t, err)
		assert.Zero(t, n, "recently completed records are kept")

		backdate(t, store, "processed_at", recs[0].ID, recs[1].ID, recs[3].ID)
		n, err = store.Clean(ctx(t), time.Hour, 1)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "one batch deletes at most the limit")
		n, err = store.Clean(ctx(t), time.Hour, 10)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		n, err = store.Clean(ctx(t), time.Hour, 10)
		require.NoError(t, err)
		assert.Zero(t, n)

		ids := rowIDs(t, store)
		assert.Len(t, ids, 3, "the recent completed, the abandoned and the pending records stay")
		assert.Contains(t, ids, recs[2].UUID)
		assert.Contains(t, ids, recs[3].UUID, "abandoned records are kept")
		assert.Contains(t, ids, recs[4].UUID)
	})

	t.Run("DeletingTableHasNothingToPurge", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Delete)
		insert(t, store, records("orders", 2))
		n, err := store.Clean(ctx(t), 0, 10)
		require.NoError(t, err)
		assert.Zero(t, n)
		assert.Equal(t, 2, rowCount(t, store))
	})
}

func (s *suite) testStatus(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
		store := s.store(t, mode)
		empty, err := store.Status(ctx(t))
		require.NoError(t, err)
		assert.Empty(t, empty)

		orders := insert(t, store, records("orders", 4))
		insert(t, store, records("refunds", 1))
		require.NoError(t, store.Complete(ctx(t), dlv(orders[0].ID)))
		_, _, err = store.RecordFailure(ctx(t), dlv(orders[1].ID), "poison", 1, nil)
		require.NoError(t, err)
		backdate(t, store, "created_at", orders[2].ID)

		completed := int64(1)
		if mode == sqlstore.Delete {
			completed = 0
		}
		got, err := store.Status(ctx(t))
		require.NoError(t, err)
		require.Len(t, got, 2)
		assert.Equal(t, "orders", got[0].Topic)
		assert.Equal(t, int64(2), got[0].Pending)
		assert.Equal(t, int64(1), got[0].Abandoned)
		assert.Equal(t, completed, got[0].Completed)
		assert.Greater(t, got[0].OldestPending, 20*365*24*time.Hour, "the oldest pending record's age, by the database clock")
		assert.Equal(t, recordstore.TopicStatus{Topic: "refunds", Pending: 1, OldestPending: got[1].OldestPending}, got[1])
		assert.Less(t, got[1].OldestPending, time.Hour)

		pending, err := store.PendingStatus(ctx(t))
		require.NoError(t, err)
		require.Len(t, pending, 2)
		assert.Equal(t, recordstore.TopicStatus{Topic: "orders", Pending: 2, OldestPending: pending[0].OldestPending}, pending[0])
		assert.Greater(t, pending[0].OldestPending, 20*365*24*time.Hour)
		assert.Equal(t, int64(1), pending[1].Pending)
	})
}
