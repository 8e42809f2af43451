package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

// twoConsumers are the consumers the per-consumer tests declare.
var twoConsumers = []string{"billing", "shipping"}

// withConsumers builds n records of "orders" that declare consumers.
func withConsumers(n int, consumers ...string) []recordstore.Record {
	recs := records("orders", n)
	for i := range recs {
		recs[i].Consumers = consumers
	}
	return recs
}

// deliveryRows counts the deliveries the store holds for a record.
func (s *contract) deliveryRows(t testing.TB, store recordstore.Store, id int64) int {
	t.Helper()
	return len(s.in.Deliveries(t, store, id))
}

// pendingIDs are the ids PendingAfter returns for "orders".
func pendingIDs(t testing.TB, store recordstore.Store) []int64 {
	t.Helper()
	recs, err := store.PendingAfter(ctx(t), "orders", 0, 1000)
	require.NoError(t, err)
	return claimedIDs(recs)
}

// assertCompleted checks that a record is complete: not pending, marked or
// deleted with its deliveries.
func (s *contract) assertCompleted(t testing.TB, store recordstore.Store, mode Completion, id int64) {
	t.Helper()
	assert.NotContains(t, pendingIDs(t, store), id, "record %d is complete", id)
	if mode == Delete {
		s.completedAt(t, store, mode, id) // asserts the record is gone
		assert.Zero(t, s.deliveryRows(t, store, id), "a deleting table deletes the delivery rows with the record")
		return
	}
	assert.NotEmpty(t, s.completedAt(t, store, mode, id))
}

func (s *contract) testTopic(t *testing.T) {
	s.forEachMode(t, func(t *testing.T, mode Completion) {
		store := s.store(t, mode)
		one := insert(t, store, records("orders", 1))[0]
		many := insert(t, store, withConsumers(1, twoConsumers...))[0]
		for _, d := range []recordstore.Delivery{
			{ID: one.ID, Topic: "payments", Consumer: consumer},
			{ID: many.ID, Topic: "payments", Consumer: "billing"},
		} {
			err := store.CheckPending(ctx(t), d)
			assert.ErrorIs(t, err, recordstore.ErrUnknownRecord, "record %d is not a record of %q", d.ID, d.Topic)
		}
		assert.NoError(t, store.CheckPending(ctx(t), dlv(one.ID)))
		assert.NoError(t, store.CheckPending(ctx(t), consumerDlv(many.ID, "billing")))
	})
}

func (s *contract) testOneReceiver(t *testing.T) {
	t.Run("ACopyForAnotherConsumerIsAConflict", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		id := insert(t, store, records("orders", 1))[0].ID
		require.NoError(t, store.Complete(ctx(t), consumerDlv(id, "billing")))

		err := store.CheckPending(ctx(t), consumerDlv(id, "shipping"))
		var conflict *recordstore.ConsumerConflictError
		require.ErrorAs(t, err, &conflict)
		assert.Equal(t, recordstore.ConsumerConflictError{ID: id, Consumer: "shipping", CompletedBy: "billing"}, *conflict)
		assert.ErrorIs(t, err, recordstore.ErrCompletedByOther)
		assert.ErrorIs(t, store.CheckPending(ctx(t), consumerDlv(id, "billing")), recordstore.ErrNotPending, "the consumer that completed it")
		assert.ErrorIs(t, store.CheckPending(ctx(t), consumerDlv(id, "")), recordstore.ErrNotPending, "outside a router there is no consumer to tell")
		assert.ErrorIs(t, store.Complete(ctx(t), consumerDlv(id, "shipping")), recordstore.ErrNotPending, "the first completion stands")
	})

	t.Run("RecordsCompletedWithoutAConsumerAreNotConflicts", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		id := insert(t, store, records("orders", 1))[0].ID
		require.NoError(t, store.Complete(ctx(t), consumerDlv(id, "")))
		assert.ErrorIs(t, store.CheckPending(ctx(t), consumerDlv(id, "shipping")), recordstore.ErrNotPending)
	})

	t.Run("DeletingTableForgetsWhoCompleted", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Delete)
		id := insert(t, store, records("orders", 1))[0].ID
		require.NoError(t, store.Complete(ctx(t), consumerDlv(id, "billing")))
		assert.ErrorIs(t, store.CheckPending(ctx(t), consumerDlv(id, "shipping")), recordstore.ErrNotPending)
	})
}

func (s *contract) testConsumers(t *testing.T) {
	t.Run("EachConsumerCompletesItsOwnDelivery", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, withConsumers(2, twoConsumers...))
			id, other := recs[0].ID, recs[1].ID
			assert.Equal(t, 2, s.deliveryRows(t, store, id), "one delivery per consumer")

			billing, shipping := consumerDlv(id, "billing"), consumerDlv(id, "shipping")
			require.NoError(t, store.CheckPending(ctx(t), billing))
			require.NoError(t, store.CheckPending(ctx(t), shipping))
			require.NoError(t, store.Complete(ctx(t), billing))
			assert.ErrorIs(t, store.CheckPending(ctx(t), billing), recordstore.ErrNotPending, "billing's copy is a duplicate for billing")
			assert.ErrorIs(t, store.Complete(ctx(t), billing), recordstore.ErrNotPending)
			require.NoError(t, store.CheckPending(ctx(t), shipping), "and still pending for shipping")
			assert.Equal(t, []int64{id, other}, pendingIDs(t, store), "the record stays pending until every consumer completed it")

			require.NoError(t, store.Complete(ctx(t), shipping))
			s.assertCompleted(t, store, mode, id)
			assert.ErrorIs(t, store.CheckPending(ctx(t), shipping), recordstore.ErrNotPending)
			assert.ErrorIs(t, store.CheckPending(ctx(t), billing), recordstore.ErrNotPending)
			assert.Equal(t, []int64{other}, pendingIDs(t, store))
			require.NoError(t, store.CheckPending(ctx(t), consumerDlv(other, "billing")), "other records are untouched")
		})
	})

	t.Run("AConsumerNotDeclaredHasNoDelivery", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			id := insert(t, store, withConsumers(1, twoConsumers...))[0].ID
			for _, c := range []string{"audit", ""} {
				err := store.CheckPending(ctx(t), consumerDlv(id, c))
				assert.ErrorIs(t, err, recordstore.ErrNoDelivery, "consumer %q", c)
				assert.ErrorIs(t, store.Complete(ctx(t), consumerDlv(id, c)), recordstore.ErrNotPending, "consumer %q completes nothing", c)
			}
			assert.Equal(t, []int64{id}, pendingIDs(t, store))
		})
	})

	t.Run("DuplicateConsumersAreOneDelivery", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		id := insert(t, store, withConsumers(1, "billing", "billing", "shipping"))[0].ID
		assert.Equal(t, 2, s.deliveryRows(t, store, id))
		require.NoError(t, store.Complete(ctx(t), consumerDlv(id, "billing")))
		require.NoError(t, store.Complete(ctx(t), consumerDlv(id, "shipping")))
		s.assertCompleted(t, store, Mark, id)
	})

	t.Run("MixedBatchesKeepTheirOrderAndDeliveries", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := records("orders", 6)
			for i := range recs {
				if i%2 == 1 {
					recs[i].Consumers = twoConsumers
				}
			}
			insert(t, store, recs)
			ids := s.in.IDs(t, store)
			for i, r := range recs {
				require.Equal(t, ids[r.UUID], r.ID)
				if i > 0 {
					require.Greater(t, r.ID, recs[i-1].ID)
				}
				want := 0
				if i%2 == 1 {
					want = 2
				}
				assert.Equal(t, want, s.deliveryRows(t, store, r.ID), "record #%d", i)
			}
			require.NoError(t, store.Complete(ctx(t), dlv(recs[0].ID)))
			assert.ErrorIs(t, store.CheckPending(ctx(t), consumerDlv(recs[1].ID, consumer)), recordstore.ErrNoDelivery)
		})
	})

	t.Run("ConcurrentConsumersCompleteTheRecordExactlyWhenAllHave", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			const consumers, rounds = 6, 25
			names := make([]string, consumers)
			for i := range names {
				names[i] = fmt.Sprintf("consumer%d", i)
			}
			recs := insert(t, store, withConsumers(rounds, names...))
			for _, r := range recs {
				start := make(chan struct{})
				errs := make([]error, consumers)
				var wg sync.WaitGroup
				for i, name := range names {
					wg.Go(func() {
						<-start
						errs[i] = store.Complete(ctx(t), consumerDlv(r.ID, name))
					})
				}
				close(start)
				wg.Wait()
				for i, err := range errs {
					require.NoError(t, err, "consumer %s of record %d", names[i], r.ID)
				}
			}
			assert.Empty(t, pendingIDs(t, store), "no record is left pending once every delivery is complete")
			for _, r := range recs {
				s.assertCompleted(t, store, mode, r.ID)
			}
		})
	})

	t.Run("CleanDeletesTheDeliveryRows", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		cleaner := need[recordstore.Cleaner](t, store)
		recs := insert(t, store, withConsumers(2, twoConsumers...))
		for _, c := range twoConsumers {
			require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[0].ID, c)))
		}
		require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[1].ID, "billing")))
		assert.Equal(t, 2, s.deliveryRows(t, store, recs[0].ID), "a marking table keeps the deliveries of a completed record")
		s.in.Backdate(t, store, CompletedAt, recs[0].ID)
		n, err := cleaner.Clean(ctx(t), time.Hour, 10)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.Zero(t, s.deliveryRows(t, store, recs[0].ID), "cleaned with their record")
		assert.Equal(t, 2, s.deliveryRows(t, store, recs[1].ID), "a pending record keeps its deliveries")
		assert.Equal(t, 1, s.rowCount(t, store))
	})
}

func (s *contract) testConsumerLease(t *testing.T) {
	s.forEachMode(t, func(t *testing.T, mode Completion) {
		store, releaser := s.leased(t, mode, time.Hour)
		id := insert(t, store, withConsumers(1, twoConsumers...))[0].ID
		billing := withLease(consumerDlv(id, "billing"), "billing-1")
		shipping := withLease(consumerDlv(id, "shipping"), "shipping-1")
		billingCopy := withLease(consumerDlv(id, "billing"), "billing-2")

		require.NoError(t, store.CheckPending(ctx(t), billing), "billing claims its delivery")
		require.NoError(t, store.CheckPending(ctx(t), shipping), "shipping holds a lease on the same record at the same time")
		assert.ErrorIs(t, store.CheckPending(ctx(t), billingCopy), recordstore.ErrLeased, "a second copy for billing is refused")

		require.NoError(t, releaser.Release(ctx(t), billingCopy), "releasing with another token is harmless")
		assert.ErrorIs(t, store.CheckPending(ctx(t), billingCopy), recordstore.ErrLeased, "and does not release billing's claim")
		require.NoError(t, releaser.Release(ctx(t), billing))
		require.NoError(t, store.CheckPending(ctx(t), billingCopy), "the released delivery is claimed again")
		assert.ErrorIs(t, store.CheckPending(ctx(t), withLease(shipping, "shipping-2")), recordstore.ErrLeased, "shipping's claim is its own")

		require.NoError(t, store.Complete(ctx(t), billingCopy))
		assert.ErrorIs(t, store.CheckPending(ctx(t), billing), recordstore.ErrNotPending)
		assert.ErrorIs(t, store.CheckPending(ctx(t), withLease(consumerDlv(id, "audit"), "audit-1")), recordstore.ErrNoDelivery)
		assert.ErrorIs(t, store.CheckPending(ctx(t), recordstore.Delivery{ID: id, Topic: "payments", Consumer: "shipping", Lease: "x"}), recordstore.ErrUnknownRecord)
		require.NoError(t, store.Complete(ctx(t), shipping))
		s.assertCompleted(t, store, mode, id)
	})
}

func (s *contract) testConsumerAttempts(t *testing.T) {
	t.Run("AbandonOneDeliveryThenRequeue", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			fr, rq := failures(t, store)
			id := insert(t, store, withConsumers(1, twoConsumers...))[0].ID
			billing, shipping := consumerDlv(id, "billing"), consumerDlv(id, "shipping")

			n, abandoned, err := fr.RecordFailure(ctx(t), billing, "boom", 2, nil)
			require.NoError(t, err)
			assert.Equal(t, 1, n)
			assert.False(t, abandoned)
			n, abandoned, err = fr.RecordFailure(ctx(t), shipping, "other boom", 2, nil)
			require.NoError(t, err)
			assert.Equal(t, 1, n, "each consumer counts its own attempts")
			n, abandoned, err = fr.RecordFailure(ctx(t), billing, "last boom", 2, nil)
			require.NoError(t, err)
			assert.Equal(t, 2, n)
			assert.True(t, abandoned, "billing's delivery is abandoned")

			assert.ErrorIs(t, store.CheckPending(ctx(t), billing), recordstore.ErrNotPending)
			require.NoError(t, store.CheckPending(ctx(t), shipping), "shipping's delivery is still pending")
			assert.Equal(t, []int64{id}, pendingIDs(t, store), "the record is pending while a delivery is")
			_, err = rq.Requeue(ctx(t), id)
			assert.ErrorIs(t, err, recordstore.ErrNotAbandoned, "a record with a pending delivery is not abandoned")
			_, _, err = fr.RecordFailure(ctx(t), billing, "again", 2, nil)
			assert.ErrorIs(t, err, recordstore.ErrNotPending)

			require.NoError(t, store.Complete(ctx(t), shipping))
			assert.Empty(t, pendingIDs(t, store), "with no delivery pending and one abandoned, the record is abandoned")
			st, found := s.in.Record(t, store, id)
			require.True(t, found)
			assert.Equal(t, Abandoned, st.State)
			assert.Equal(t, []StoredDelivery{
				{Consumer: "billing", State: Abandoned, Attempts: 2, LastError: "last boom"},
				{Consumer: "shipping", State: Completed, Attempts: 1, LastError: "other boom"},
			}, s.in.Deliveries(t, store, id), "each delivery keeps its own state")

			got, err := rq.Requeue(ctx(t), id)
			require.NoError(t, err)
			assert.Equal(t, id, got.ID)
			assert.Equal(t, []int64{id}, pendingIDs(t, store))
			require.NoError(t, store.CheckPending(ctx(t), billing), "the abandoned delivery is pending again")
			assert.ErrorIs(t, store.CheckPending(ctx(t), shipping), recordstore.ErrNotPending, "the completed delivery stays completed")
			n, abandoned, err = fr.RecordFailure(ctx(t), billing, "after requeue", 2, nil)
			require.NoError(t, err)
			assert.Equal(t, 1, n, "requeueing resets the attempts")
			assert.False(t, abandoned)
			require.NoError(t, store.Complete(ctx(t), billing))
			s.assertCompleted(t, store, mode, id)
		})
	})

	t.Run("AllAbandonedAbandonsTheRecord", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Delete)
		fr := need[recordstore.FailureRecorder](t, store)
		id := insert(t, store, withConsumers(1, twoConsumers...))[0].ID
		for _, c := range twoConsumers {
			_, abandoned, err := fr.RecordFailure(ctx(t), consumerDlv(id, c), "poison", 1, nil)
			require.NoError(t, err)
			require.True(t, abandoned)
		}
		assert.Empty(t, pendingIDs(t, store))
		got, found := s.in.Record(t, store, id)
		require.True(t, found, "a deleting table keeps the abandoned record")
		assert.Equal(t, Abandoned, got.State, "a deleting table keeps the abandoned record")
	})
}

func (s *contract) testRetry(t *testing.T) {
	t.Run("OneReceiver", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			fr := need[recordstore.FailureRecorder](t, store)
			cl := need[recordstore.StaleClaimer](t, store)
			recs := insert(t, store, records("orders", 2))
			id := recs[0].ID
			s.in.Backdate(t, store, SavedAt)

			_, _, err := fr.RecordFailure(ctx(t), dlv(id), "boom", 0, after(untilDue))
			require.NoError(t, err)
			assertNotDue(t, store.CheckPending(ctx(t), dlv(id)), id)
			claimed, err := cl.ClaimStale(ctx(t), "orders", 0, time.Minute, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{recs[1].ID}, claimedIDs(claimed), "a record that is not due is passed over")
			assert.Equal(t, []int64{id, recs[1].ID}, pendingIDs(t, store), "a record that is not due is still pending")

			s.in.Backdate(t, store, DueAt, id)
			require.NoError(t, store.CheckPending(ctx(t), dlv(id)), "due again")
			s.in.Backdate(t, store, SentAt)
			claimed, err = cl.ClaimStale(ctx(t), "orders", 0, time.Minute, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{id, recs[1].ID}, claimedIDs(claimed))

			_, _, err = fr.RecordFailure(ctx(t), dlv(id), "boom", 0, nil)
			require.NoError(t, err)
			require.NoError(t, store.CheckPending(ctx(t), dlv(id)), "no delay makes it due at once")
		})
	})

	t.Run("PerConsumer", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			fr := need[recordstore.FailureRecorder](t, store)
			cl := need[recordstore.StaleClaimer](t, store)
			id := insert(t, store, withConsumers(1, twoConsumers...))[0].ID
			billing, shipping := consumerDlv(id, "billing"), consumerDlv(id, "shipping")
			s.in.Backdate(t, store, SavedAt)

			_, _, err := fr.RecordFailure(ctx(t), billing, "boom", 0, after(untilDue))
			require.NoError(t, err)
			assertNotDue(t, store.CheckPending(ctx(t), billing), id)
			require.NoError(t, store.CheckPending(ctx(t), shipping), "the other consumer's delivery is due")
			claimed, err := cl.ClaimStale(ctx(t), "orders", 0, time.Minute, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{id}, claimedIDs(claimed), "a record is due while one of its pending deliveries is")

			require.NoError(t, store.Complete(ctx(t), shipping))
			s.in.Backdate(t, store, SentAt)
			claimed, err = cl.ClaimStale(ctx(t), "orders", 0, time.Minute, 10)
			require.NoError(t, err)
			assert.Empty(t, claimed, "its only pending delivery is not due")

			s.in.Backdate(t, store, DueAt, id)
			require.NoError(t, store.CheckPending(ctx(t), billing))
			claimed, err = cl.ClaimStale(ctx(t), "orders", 0, time.Minute, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{id}, claimedIDs(claimed))
		})
	})
}

// assertNotDue checks that err says record id is due in about untilDue.
func assertNotDue(t testing.TB, err error, id int64) {
	t.Helper()
	var notDue *recordstore.NotDueError
	require.ErrorAs(t, err, &notDue)
	assert.ErrorIs(t, err, recordstore.ErrNotDue)
	assert.Equal(t, id, notDue.ID)
	assert.InDelta(t, untilDue.Seconds(), notDue.Wait.Seconds(), 60, "waits about %v by the database clock, got %v", untilDue, notDue.Wait)
}

func (s *contract) testConsumerStatus(t *testing.T) {
	s.forEachMode(t, func(t *testing.T, mode Completion) {
		store := s.store(t, mode)
		fr := need[recordstore.FailureRecorder](t, store)
		sr := need[recordstore.StatusReader](t, store)
		recs := insert(t, store, withConsumers(3, twoConsumers...))
		insert(t, store, records("refunds", 1))
		require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[0].ID, "billing")))
		require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[0].ID, "shipping")))
		require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[1].ID, "billing")))
		_, _, err := fr.RecordFailure(ctx(t), consumerDlv(recs[2].ID, "shipping"), "poison", 1, nil)
		require.NoError(t, err)
		s.in.Backdate(t, store, SavedAt, recs[2].ID)

		// The completed record's deliveries are gone on a deleting table.
		billingCompleted := map[Completion]int64{Mark: 2, Delete: 1}[mode]
		shippingCompleted := map[Completion]int64{Mark: 1, Delete: 0}[mode]
		full, err := sr.Status(ctx(t))
		require.NoError(t, err)
		require.Len(t, full, 2)
		orders := full[0]
		assert.Equal(t, "orders", orders.Topic)
		assert.Equal(t, int64(2), orders.Pending, "a record is pending while one of its deliveries is")
		require.Len(t, orders.Consumers, 2)
		assert.Equal(t, recordstore.ConsumerStatus{Consumer: "billing", Pending: 1, OldestPending: orders.Consumers[0].OldestPending, Completed: billingCompleted, Unchecked: unchecked(store, 1)}, orders.Consumers[0])
		assert.Equal(t, recordstore.ConsumerStatus{Consumer: "shipping", Pending: 1, OldestPending: orders.Consumers[1].OldestPending, Abandoned: 1, Completed: shippingCompleted, Unchecked: unchecked(store, 1)}, orders.Consumers[1])
		assert.Greater(t, orders.Consumers[0].OldestPending, 20*365*24*time.Hour, "billing's oldest pending record is the backdated one")
		assert.Less(t, orders.Consumers[1].OldestPending, time.Hour, "shipping's backdated delivery is abandoned")
		assert.Nil(t, full[1].Consumers, "a name without consumers has no breakdown")

		pending, err := sr.PendingStatus(ctx(t))
		require.NoError(t, err)
		require.Len(t, pending, 2)
		require.Len(t, pending[0].Consumers, 2)
		assert.Equal(t, recordstore.ConsumerStatus{Consumer: "billing", Pending: 1, OldestPending: orders.Consumers[0].OldestPending, Unchecked: unchecked(store, 1)}, withoutAge(pending[0].Consumers[0], orders.Consumers[0].OldestPending))
		assert.Equal(t, recordstore.ConsumerStatus{Consumer: "shipping", Pending: 1, OldestPending: orders.Consumers[1].OldestPending, Unchecked: unchecked(store, 1)}, withoutAge(pending[0].Consumers[1], orders.Consumers[1].OldestPending))
	})
}

// withoutAge replaces an age read later than want, within a minute, by want.
func withoutAge(st recordstore.ConsumerStatus, want time.Duration) recordstore.ConsumerStatus {
	if d := st.OldestPending - want; d >= 0 && d < time.Minute {
		st.OldestPending = want
	}
	return st
}

// after is a retry schedule of one fixed delay.
func after(d time.Duration) func(int) time.Duration { return func(int) time.Duration { return d } }
