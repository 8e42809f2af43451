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

// failures returns the store's FailureRecorder and Requeuer, skipping the
// test when it lacks one.
func failures(t *testing.T, store recordstore.Store) (recordstore.FailureRecorder, recordstore.Requeuer) {
	t.Helper()
	return need[recordstore.FailureRecorder](t, store), need[recordstore.Requeuer](t, store)
}

func (s *contract) testAttempts(t *testing.T) {
	t.Run("FailuresCountThenAbandonAndRequeue", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			fr, rq := failures(t, store)
			recs := insert(t, store, records("orders", 2))
			id := recs[0].ID

			for want := 1; want <= 2; want++ {
				n, abandoned, err := fr.RecordFailure(ctx(t), dlv(id), "boom", 3, nil)
				require.NoError(t, err)
				assert.Equal(t, want, n)
				assert.False(t, abandoned)
				require.NoError(t, store.CheckPending(ctx(t), dlv(id)), "a failed record stays pending")
			}
			n, abandoned, err := fr.RecordFailure(ctx(t), dlv(id), "last boom", 3, nil)
			require.NoError(t, err)
			assert.Equal(t, 3, n)
			assert.True(t, abandoned, "the third failure of three abandons")

			assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(id)), recordstore.ErrNotPending, "an abandoned record is not pending")
			pending, err := store.PendingAfter(ctx(t), "orders", 0, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{recs[1].ID}, claimedIDs(pending), "replay skips the abandoned record")
			assert.Equal(t, 2, s.rowCount(t, store), "the abandoned record is kept")
			_, _, err = fr.RecordFailure(ctx(t), dlv(id), "again", 3, nil)
			assert.ErrorIs(t, err, recordstore.ErrNotPending)

			st, found := s.in.Record(t, store, id)
			require.True(t, found)
			assert.Equal(t, "last boom", st.LastError)

			_, err = rq.Requeue(ctx(t), recs[1].ID)
			assert.ErrorIs(t, err, recordstore.ErrNotAbandoned, "a pending record is not requeued")
			got, err := rq.Requeue(ctx(t), id)
			require.NoError(t, err)
			assert.Equal(t, recs[0].UUID, got.UUID)
			assert.Equal(t, recs[0].Payload, got.Payload)
			assert.Equal(t, "orders", got.Topic)
			require.NoError(t, store.CheckPending(ctx(t), dlv(id)), "a requeued record is pending again")
			n, abandoned, err = fr.RecordFailure(ctx(t), dlv(id), "after requeue", 3, nil)
			require.NoError(t, err)
			assert.Equal(t, 1, n, "requeuing resets the attempts")
			assert.False(t, abandoned)
		})
	})

	t.Run("AnErrorTextOfAnyBytesIsCounted", func(t *testing.T) {
		// A handler's error may quote bytes its database cannot keep:
		// the failure counts all the same, or MaxAttempts never comes.
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			fr := need[recordstore.FailureRecorder](t, store)
			id := insert(t, store, records("orders", 1))[0].ID
			n, abandoned, err := fr.RecordFailure(ctx(t), dlv(id), "boom \x00 \xff\xfe boom", 2, nil)
			require.NoError(t, err)
			assert.Equal(t, 1, n)
			assert.False(t, abandoned)
			_, abandoned, err = fr.RecordFailure(ctx(t), dlv(id), "\x00", 2, nil)
			require.NoError(t, err)
			assert.True(t, abandoned, "the second failure of two abandons")
		})
	})

	t.Run("ZeroMaxAttemptsNeverAbandons", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		fr := need[recordstore.FailureRecorder](t, store)
		id := insert(t, store, records("orders", 1))[0].ID
		for range 5 {
			_, abandoned, err := fr.RecordFailure(ctx(t), dlv(id), "boom", 0, nil)
			require.NoError(t, err)
			require.False(t, abandoned)
		}
		require.NoError(t, store.CheckPending(ctx(t), dlv(id)))
	})

	t.Run("CompletedRecordIsNotCounted", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			fr := need[recordstore.FailureRecorder](t, store)
			id := insert(t, store, records("orders", 1))[0].ID
			require.NoError(t, store.Complete(ctx(t), dlv(id)))
			_, _, err := fr.RecordFailure(ctx(t), dlv(id), "late", 1, nil)
			assert.ErrorIs(t, err, recordstore.ErrNotPending)
		})
	})
}

// testAttempts runs the failure tests that read sqlstore's bounds.
func (s *suite) testAttempts(t *testing.T) {
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
}

func (s *contract) testClaimStale(t *testing.T) {
	t.Run("ByLastSendAndRestamps", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			cl := need[recordstore.StaleClaimer](t, store)
			recs := insert(t, store, records("orders", 3))
			insert(t, store, records("other", 1))
			a, b, c := recs[0].ID, recs[1].ID, recs[2].ID

			got, err := cl.ClaimStale(ctx(t), "orders", 0, time.Hour, 10)
			require.NoError(t, err)
			assert.Empty(t, got, "records just sent are not stale")

			s.in.Backdate(t, store, SavedAt, a, b)
			got, err = cl.ClaimStale(ctx(t), "orders", 0, time.Hour, 1)
			require.NoError(t, err)
			assert.Equal(t, []int64{a}, claimedIDs(got), "oldest first, limit kept")
			assert.Equal(t, recs[0].UUID, got[0].UUID)
			assert.Equal(t, recs[0].Metadata, got[0].Metadata)
			got, err = cl.ClaimStale(ctx(t), "orders", 0, time.Hour, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{b}, claimedIDs(got), "a claimed record counts as sent now")

			require.NoError(t, store.Complete(ctx(t), dlv(b)))
			s.in.Backdate(t, store, SavedAt)
			s.in.Backdate(t, store, SentAt)
			got, err = cl.ClaimStale(ctx(t), "orders", 0, time.Hour, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{a, c}, claimedIDs(got), "completed records and other topics are not claimed")
		})
	})

	t.Run("SpacedClaimWaitsLongerAfterEachResend", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			cl := need[recordstore.SpacedClaimer](t, store)
			recs := insert(t, store, records("orders", 2))
			a, b := recs[0].ID, recs[1].ID

			got, err := cl.ClaimSpaced(ctx(t), "orders", 0, time.Hour, 2*time.Hour, 10, 0)
			require.NoError(t, err)
			assert.Empty(t, got, "records just saved wait the minimum age")

			s.in.Backdate(t, store, SavedAt, a)
			got, err = cl.ClaimSpaced(ctx(t), "orders", 0, time.Minute, time.Hour, 10, 0)
			require.NoError(t, err)
			assert.Equal(t, []int64{a}, claimedIDs(got), "a record never sent again waits the minimum age from its save")

			got, err = cl.ClaimSpaced(ctx(t), "orders", 0, time.Microsecond, time.Hour, 10, 0)
			require.NoError(t, err)
			assert.NotContains(t, claimedIDs(got), a, "after a resend it waits as long as it had waited, though that is far beyond the minimum")

			s.in.Backdate(t, store, SentAt, a)
			got, err = cl.ClaimSpaced(ctx(t), "orders", 0, time.Minute, time.Hour, 10, 0)
			require.NoError(t, err)
			assert.Equal(t, []int64{a}, claimedIDs(got), "a record last sent longer ago than the maximum age is claimed")
			assert.NotContains(t, claimedIDs(got), b)

			_, err = cl.ClaimSpaced(ctx(t), "orders", 0, time.Hour, time.Minute, 10, 0)
			require.ErrorIs(t, err, recordstore.ErrInvalidConfig, "a maximum shorter than the minimum")
		})
	})

	t.Run("AfterIDIsACursor", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		cl := need[recordstore.StaleClaimer](t, store)
		recs := insert(t, store, records("orders", 3))
		a, b, c := recs[0].ID, recs[1].ID, recs[2].ID
		s.in.Backdate(t, store, SavedAt)

		got, err := cl.ClaimStale(ctx(t), "orders", a, time.Hour, 10)
		require.NoError(t, err)
		assert.Equal(t, []int64{b, c}, claimedIDs(got), "only records after the cursor")
		got, err = cl.ClaimStale(ctx(t), "orders", 0, time.Hour, 10)
		require.NoError(t, err)
		assert.Equal(t, []int64{a}, claimedIDs(got), "a record before the cursor was neither claimed nor stamped")
		got, err = cl.ClaimStale(ctx(t), "orders", c, time.Hour, 10)
		require.NoError(t, err)
		assert.Empty(t, got)
	})

	t.Run("ConcurrentClaimsNeverShareARecord", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		cl := need[recordstore.StaleClaimer](t, store)
		recs := insert(t, store, records("orders", 60))
		s.in.Backdate(t, store, SavedAt)
		var mu sync.Mutex
		seen := map[int64]int{}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					got, err := cl.ClaimStale(ctx(t), "orders", 0, time.Hour, 5)
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
		store := s.store(t, Mark)
		cl := need[recordstore.StaleClaimer](t, store)
		stamper := need[recordstore.SendStamper](t, store)
		recs := insert(t, store, records("orders", 1201))
		s.in.Backdate(t, store, SavedAt)
		ids := claimedIDs(recs)
		require.NoError(t, stamper.StampSent(ctx(t), ids[:1200]))
		got, err := cl.ClaimStale(ctx(t), "orders", 0, time.Hour, 10)
		require.NoError(t, err)
		assert.Equal(t, ids[1200:], claimedIDs(got), "every stamped record, across chunks, counts as just sent")
	})
}

// testClaimStale runs the claim tests that read sqlstore's errors.
func (s *suite) testClaimStale(t *testing.T) {
	t.Run("BadArgumentsAreRefused", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		_, err := store.ClaimStale(ctx(t), "orders", 0, 0, 10)
		assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
		_, err = store.ClaimStale(ctx(t), "orders", 0, time.Hour, 0)
		assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
	})
}

func (s *contract) testClean(t *testing.T) {
	t.Run("DeletesOldCompletedInBatches", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		cleaner := need[recordstore.Cleaner](t, store)
		fr := need[recordstore.FailureRecorder](t, store)
		recs := insert(t, store, records("orders", 5))
		for _, r := range recs[:3] {
			require.NoError(t, store.Complete(ctx(t), dlv(r.ID)))
		}
		_, abandoned, err := fr.RecordFailure(ctx(t), dlv(recs[3].ID), "poison", 1, nil)
		require.NoError(t, err)
		require.True(t, abandoned)

		n, err := cleaner.Clean(ctx(t), time.Hour, 10)
		require.NoError(t, err)
		assert.Zero(t, n, "recently completed records are kept")

		s.in.Backdate(t, store, CompletedAt, recs[0].ID, recs[1].ID, recs[3].ID)
		n, err = cleaner.Clean(ctx(t), time.Hour, 1)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "one batch deletes at most the limit")
		n, err = cleaner.Clean(ctx(t), time.Hour, 10)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		n, err = cleaner.Clean(ctx(t), time.Hour, 10)
		require.NoError(t, err)
		assert.Zero(t, n)

		ids := s.in.IDs(t, store)
		assert.Len(t, ids, 3, "the recent completed, the abandoned and the pending records stay")
		assert.Contains(t, ids, recs[2].UUID)
		assert.Contains(t, ids, recs[3].UUID, "abandoned records are kept")
		assert.Contains(t, ids, recs[4].UUID)
	})

	t.Run("DeletingTableHasNothingToClean", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Delete)
		cleaner := need[recordstore.Cleaner](t, store)
		insert(t, store, records("orders", 2))
		n, err := cleaner.Clean(ctx(t), 0, 10)
		require.NoError(t, err)
		assert.Zero(t, n)
		assert.Equal(t, 2, s.rowCount(t, store))
	})
}

func (s *contract) testStatus(t *testing.T) {
	s.forEachMode(t, func(t *testing.T, mode Completion) {
		store := s.store(t, mode)
		sr := need[recordstore.StatusReader](t, store)
		fr := need[recordstore.FailureRecorder](t, store)
		empty, err := sr.Status(ctx(t))
		require.NoError(t, err)
		assert.Empty(t, empty)

		orders := insert(t, store, records("orders", 4))
		insert(t, store, records("refunds", 1))
		require.NoError(t, store.Complete(ctx(t), dlv(orders[0].ID)))
		_, _, err = fr.RecordFailure(ctx(t), dlv(orders[1].ID), "poison", 1, nil)
		require.NoError(t, err)
		s.in.Backdate(t, store, SavedAt, orders[2].ID)

		completed := int64(1)
		if mode == Delete {
			completed = 0
		}
		got, err := sr.Status(ctx(t))
		require.NoError(t, err)
		require.Len(t, got, 2)
		assert.Equal(t, "orders", got[0].Topic)
		assert.Equal(t, int64(2), got[0].Pending)
		assert.Equal(t, int64(1), got[0].Abandoned)
		assert.Equal(t, completed, got[0].Completed)
		assert.Greater(t, got[0].OldestPending, 20*365*24*time.Hour, "the oldest pending record's age, by the database clock")
		assert.Equal(t, unchecked(store, 2), got[0].Unchecked, "no receiver was seen")
		assert.Equal(t, recordstore.TopicStatus{Topic: "refunds", Pending: 1, OldestPending: got[1].OldestPending, Unchecked: unchecked(store, 1)}, got[1])
		assert.Less(t, got[1].OldestPending, time.Hour)

		pending, err := sr.PendingStatus(ctx(t))
		require.NoError(t, err)
		require.Len(t, pending, 2)
		assert.Equal(t, recordstore.TopicStatus{Topic: "orders", Pending: 2, OldestPending: pending[0].OldestPending, Unchecked: unchecked(store, 2)}, pending[0])
		assert.Greater(t, pending[0].OldestPending, 20*365*24*time.Hour)
		assert.Equal(t, int64(1), pending[1].Pending)
	})
}
