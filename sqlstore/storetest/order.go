package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

// keyed builds records of topic "orders" with the order keys, in order.
func keyed(keys ...string) []recordstore.Record {
	recs := records("orders", len(keys))
	for i, k := range keys {
		recs[i].OrderKey = k
	}
	return recs
}

// ordered is d checked in order, with the policy for abandoned records.
func ordered(d recordstore.Delivery, skipAbandoned bool) recordstore.Delivery {
	d.Ordered, d.SkipAbandoned = true, skipAbandoned
	return d
}

// requireHeld requires err to be a [*recordstore.HeldError] of record id
// held by before.
func requireHeld(t *testing.T, err error, id, before int64, abandoned bool) {
	t.Helper()
	var held *recordstore.HeldError
	require.ErrorAs(t, err, &held, "record %d", id)
	assert.ErrorIs(t, err, recordstore.ErrHeld)
	assert.Equal(t, recordstore.HeldError{ID: id, Before: before, Abandoned: abandoned}, *held)
}

func (s *contract) testOrder(t *testing.T) {
	t.Run("LaterRecordOfAKeyIsHeldUntilTheEarlierCompletes", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, keyed("a", "b", "a", "", "a"))
			a1, b1, a2, none, a3 := recs[0].ID, recs[1].ID, recs[2].ID, recs[3].ID, recs[4].ID

			require.NoError(t, store.CheckPending(ctx(t), ordered(dlv(a1), false)), "the first of its key runs")
			require.NoError(t, store.CheckPending(ctx(t), ordered(dlv(b1), false)), "another key is not held")
			require.NoError(t, store.CheckPending(ctx(t), ordered(dlv(none), false)), "a record without a key is not held")
			requireHeld(t, store.CheckPending(ctx(t), ordered(dlv(a2), false)), a2, a1, false)
			requireHeld(t, store.CheckPending(ctx(t), ordered(dlv(a3), false)), a3, a1, false)
			require.NoError(t, store.CheckPending(ctx(t), dlv(a2)), "an unordered delivery is never held")

			require.NoError(t, store.Complete(ctx(t), dlv(a1)))
			require.NoError(t, store.CheckPending(ctx(t), ordered(dlv(a2), false)))
			requireHeld(t, store.CheckPending(ctx(t), ordered(dlv(a3), false)), a3, a2, false)
			require.NoError(t, store.Complete(ctx(t), dlv(a2)))
			require.NoError(t, store.CheckPending(ctx(t), ordered(dlv(a3), false)))
		})
	})
	t.Run("HeldOnlyWhilePendingForItsConsumer", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := keyed("a", "a")
			for i := range recs {
				recs[i].Consumers = []string{"billing", "shipping"}
			}
			insert(t, store, recs)
			first, second := recs[0].ID, recs[1].ID
			billing := func(id int64) recordstore.Delivery { return ordered(consumerDlv(id, "billing"), false) }
			shipping := func(id int64) recordstore.Delivery { return ordered(consumerDlv(id, "shipping"), false) }

			requireHeld(t, store.CheckPending(ctx(t), billing(second)), second, first, false)
			require.NoError(t, store.Complete(ctx(t), billing(first)))
			require.NoError(t, store.CheckPending(ctx(t), billing(second)), "billing completed the first")
			requireHeld(t, store.CheckPending(ctx(t), shipping(second)), second, first, false)
		})
	})
	t.Run("AbandonedRecordHoldsItsKeyUnlessSkipped", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			fr := need[recordstore.FailureRecorder](t, store)
			recs := insert(t, store, keyed("a", "a"))
			first, second := recs[0].ID, recs[1].ID
			_, abandoned, err := fr.RecordFailure(ctx(t), dlv(first), "poison", 1, nil)
			require.NoError(t, err)
			require.True(t, abandoned)

			requireHeld(t, store.CheckPending(ctx(t), ordered(dlv(second), false)), second, first, true)
			require.NoError(t, store.CheckPending(ctx(t), ordered(dlv(second), true)), "skipping abandoned records")

			rq, ok := store.(recordstore.Requeuer)
			if !ok {
				return
			}
			_, err = rq.Requeue(ctx(t), first)
			require.NoError(t, err)
			requireHeld(t, store.CheckPending(ctx(t), ordered(dlv(second), true)), second, first, false)
		})
	})
	t.Run("HeldIsReportedOnlyForARecordThatWouldRun", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, keyed("a", "a"))
			require.NoError(t, store.Complete(ctx(t), dlv(recs[1].ID)), "completed out of order, as an unordered consumer may")
			err := store.CheckPending(ctx(t), ordered(dlv(recs[1].ID), false))
			assert.ErrorIs(t, err, recordstore.ErrNotPending)
			assert.False(t, errors.Is(err, recordstore.ErrHeld))
		})
	})
	t.Run("HeldKeysAreReported", s.testHeldKeys)
	t.Run("StaleClaimTakesOnlyTheHeadOfAKey", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			claimer := need[recordstore.StaleClaimer](t, store)
			recs := insert(t, store, keyed("a", "a", "b", ""))
			s.in.Backdate(t, store, SavedAt)
			got, err := claimer.ClaimStale(ctx(t), "orders", 0, time.Minute, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{recs[0].ID, recs[2].ID, recs[3].ID}, claimedIDs(got), "the second record of key a would only be held")
		})
	})
	t.Run("KeyClaimTakesOnlyTheHeadOfTheKey", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			claimer := need[recordstore.KeyClaimer](t, store)
			recs := insert(t, store, keyed("a", "a", "a", "b"))
			a1, a2, a3 := recs[0].ID, recs[1].ID, recs[2].ID
			claim := func(after int64) []int64 {
				t.Helper()
				got, err := claimer.ClaimKey(ctx(t), "orders", "a", after, time.Minute)
				require.NoError(t, err)
				return claimedIDs(got)
			}

			require.NoError(t, claimer.PutBack(ctx(t), "orders", a3))
			assert.Empty(t, claim(0), "the head was sent just now; the record put back behind it would only be held")
			require.NoError(t, claimer.PutBack(ctx(t), "orders", a1))
			assert.Equal(t, []int64{a1}, claim(0), "the head put back is claimed")
			assert.Empty(t, claim(0), "and claimed once per olderThan")

			require.NoError(t, store.Complete(ctx(t), dlv(a1)))
			assert.Empty(t, claim(a1), "the new head was sent just now")
			require.NoError(t, claimer.PutBack(ctx(t), "orders", a2))
			assert.Equal(t, []int64{a2}, claim(a1))
			require.NoError(t, store.Complete(ctx(t), dlv(a2)))
			assert.Equal(t, []int64{a3}, claim(a2), "put back, and now the head")
			assert.Empty(t, claim(a3), "nothing of the key after the last record")
		})
	})
	t.Run("PredecessorsNameTheLatestEarlierRecordNotComplete", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			kp := need[recordstore.KeyPredecessors](t, store)
			fr := need[recordstore.FailureRecorder](t, store)
			recs := insert(t, store, keyed("a", "b", "a", "a", "c", "b"))
			a1, b1, a2, a3, c1, b2 := recs[0].ID, recs[1].ID, recs[2].ID, recs[3].ID, recs[4].ID, recs[5].ID
			ids := []int64{a1, b1, a2, a3, c1, b2}
			read := func() map[int64]int64 {
				t.Helper()
				got, err := kp.Predecessors(ctx(t), "orders", ids)
				require.NoError(t, err)
				return got
			}
			assert.Equal(t, map[int64]int64{a1: 0, b1: 0, a2: a1, a3: a2, c1: 0, b2: b1}, read())
			require.NoError(t, store.Complete(ctx(t), dlv(a2)))
			assert.Equal(t, map[int64]int64{a1: 0, b1: 0, a3: a1, c1: 0, b2: b1}, read(),
				"a completed record is no one's predecessor, and has none")
			_, abandoned, err := fr.RecordFailure(ctx(t), dlv(b1), "poison", 1, nil)
			require.NoError(t, err)
			require.True(t, abandoned)
			require.NoError(t, store.Complete(ctx(t), dlv(a1)))
			got := read()
			assert.Equal(t, int64(0), got[a3], "a3's earlier records are complete")
			assert.Equal(t, b1, got[b2], "an abandoned record is not complete: it still precedes")
			other, err := kp.Predecessors(ctx(t), "refunds", ids)
			require.NoError(t, err)
			assert.Empty(t, other, "another topic's records are left out")
		})
	})
	t.Run("PredecessorMessagesNameTheEarlierRecordsMessage", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			kp := need[recordstore.KeyPredecessorMessages](t, store)
			fr := need[recordstore.FailureRecorder](t, store)
			recs := insert(t, store, keyed("a", "a", "a", "b", ""))
			a1, a2, a3, b1, none := recs[0], recs[1], recs[2], recs[3].ID, recs[4].ID
			ids := []int64{a1.ID, a2.ID, a3.ID, b1, none}
			read := func(skip bool) map[int64]recordstore.Predecessor {
				t.Helper()
				got, err := kp.PredecessorMessages(ctx(t), "orders", ids, skip)
				require.NoError(t, err)
				return got
			}
			want := map[int64]recordstore.Predecessor{a1.ID: {}, a2.ID: {ID: a1.ID, UUID: a1.UUID}, a3.ID: {ID: a2.ID, UUID: a2.UUID}, b1: {}}
			assert.Equal(t, want, read(false), "the latest earlier record of the key, by id and message; a record without a key is left out")
			assert.Equal(t, want, read(true))

			_, abandoned, err := fr.RecordFailure(ctx(t), dlv(a2.ID), "poison", 1, nil)
			require.NoError(t, err)
			require.True(t, abandoned)
			assert.Equal(t, recordstore.Predecessor{ID: a2.ID, UUID: a2.UUID}, read(false)[a3.ID], "an abandoned record still precedes")
			assert.Equal(t, recordstore.Predecessor{ID: a1.ID, UUID: a1.UUID}, read(true)[a3.ID], "unless abandoned records are skipped")

			require.NoError(t, store.Complete(ctx(t), dlv(a1.ID)))
			assert.Equal(t, recordstore.Predecessor{}, read(true)[a3.ID], "nothing earlier is pending")
			_, found := read(false)[a1.ID]
			assert.False(t, found, "a complete record is left out")
			other, err := kp.PredecessorMessages(ctx(t), "refunds", ids, false)
			require.NoError(t, err)
			assert.Empty(t, other, "another topic's records are left out")
		})
	})
	t.Run("WaitingKeysNameTheKeysOfRecordsPutBack", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			claimer := need[recordstore.KeyClaimer](t, store)
			kw := need[recordstore.KeyWaiters](t, store)
			recs := insert(t, store, keyed("a", "a", "b", "c"))
			waiting := func() []string {
				t.Helper()
				got, err := kw.WaitingKeys(ctx(t), "orders", []string{"a", "b", "c", "none"}, time.Hour)
				require.NoError(t, err)
				slices.Sort(got)
				return got
			}
			assert.Empty(t, waiting(), "every record was sent just now")
			require.NoError(t, claimer.PutBack(ctx(t), "orders", recs[1].ID))
			require.NoError(t, claimer.PutBack(ctx(t), "orders", recs[2].ID))
			assert.Equal(t, []string{"a", "b"}, waiting())
			require.NoError(t, store.Complete(ctx(t), dlv(recs[2].ID)))
			assert.Equal(t, []string{"a"}, waiting(), "a complete record waits for nothing")
			other, err := kw.WaitingKeys(ctx(t), "refunds", []string{"a"}, time.Hour)
			require.NoError(t, err)
			assert.Empty(t, other, "another topic's keys are its own")
		})
	})
	t.Run("LeaseIsNotTakenByAHeldRecord", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store, _ := s.leased(t, mode, time.Hour)
			recs := insert(t, store, keyed("a", "a"))
			first, second := recs[0].ID, recs[1].ID
			requireHeld(t, store.CheckPending(ctx(t), withLease(ordered(dlv(second), false), "one")), second, first, false)
			require.NoError(t, store.CheckPending(ctx(t), withLease(ordered(dlv(first), false), "one")))
			require.ErrorIs(t, store.CheckPending(ctx(t), withLease(ordered(dlv(first), false), "two")), recordstore.ErrLeased,
				"the first copy's lease keeps a second copy out")
			require.NoError(t, store.Complete(ctx(t), dlv(first)))
			require.NoError(t, store.CheckPending(ctx(t), withLease(ordered(dlv(second), false), "two")))
		})
	})
}

func (s *contract) testHeldKeys(t *testing.T) {
	s.forEachMode(t, func(t *testing.T, mode Completion) {
		store := s.store(t, mode)
		fr := need[recordstore.FailureRecorder](t, store)
		sr := need[recordstore.StatusReader](t, store)
		recs := insert(t, store, keyed("a", "a", "b", "b", "c"))
		for _, i := range []int{0, 2, 4} {
			_, abandoned, err := fr.RecordFailure(ctx(t), dlv(recs[i].ID), "poison", 1, nil)
			require.NoError(t, err)
			require.True(t, abandoned)
		}
		require.NoError(t, store.Complete(ctx(t), dlv(recs[3].ID)))
		for _, read := range []func(context.Context) ([]recordstore.TopicStatus, error){sr.PendingStatus, sr.Status} {
			sts, err := read(ctx(t))
			require.NoError(t, err)
			require.Len(t, sts, 1)
			assert.Equal(t, int64(1), sts[0].HeldKeys, "key a: its abandoned record holds a pending one; b's is complete, c has none after it")
		}
	})
}
