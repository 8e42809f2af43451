package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

// declaredDlv is the delivery of record id of "orders" to consumer c, from
// a topic that declares the consumers now.
func declaredDlv(id int64, c string, declared ...string) recordstore.Delivery {
	d := consumerDlv(id, c)
	d.Declared = declared
	return d
}

// testDeclaredConsumers: consumers declared while records are pending
// (recordstore.Delivery.Declared).
func (s *contract) testDeclaredConsumers(t *testing.T) {
	t.Run("ARecordSavedWithoutConsumersCompletesWhenEveryDeclaredConsumerDid", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, records("orders", 2))
			id, other := recs[0].ID, recs[1].ID
			billing, shipping := declaredDlv(id, "billing", twoConsumers...), declaredDlv(id, "shipping", twoConsumers...)

			require.NoError(t, store.CheckPending(ctx(t), billing))
			require.NoError(t, store.CheckPending(ctx(t), shipping))
			require.NoError(t, store.Complete(ctx(t), billing))
			assert.Contains(t, pendingIDs(t, store), id, "pending while shipping has not completed it")
			assert.ErrorIs(t, store.CheckPending(ctx(t), billing), recordstore.ErrNotPending, "a duplicate for billing")
			require.NoError(t, store.CheckPending(ctx(t), shipping), "and still pending for shipping")
			require.NoError(t, store.Complete(ctx(t), shipping))
			s.assertCompleted(t, store, mode, id)

			// Completed without a check first: the same.
			require.NoError(t, store.Complete(ctx(t), declaredDlv(other, "shipping", twoConsumers...)))
			assert.Contains(t, pendingIDs(t, store), other)
			require.NoError(t, store.CheckPending(ctx(t), declaredDlv(other, "billing", twoConsumers...)))
			assert.ErrorIs(t, store.Complete(ctx(t), declaredDlv(other, "shipping", twoConsumers...)), recordstore.ErrNotPending)
			require.NoError(t, store.Complete(ctx(t), declaredDlv(other, "billing", twoConsumers...)))
			s.assertCompleted(t, store, mode, other)
		})
	})

	t.Run("AConsumerAddedToARecordWithConsumers", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			id := insert(t, store, withConsumers(1, "billing"))[0].ID
			require.NoError(t, store.CheckPending(ctx(t), declaredDlv(id, "shipping", twoConsumers...)), "shipping gets a delivery of its own")
			require.NoError(t, store.Complete(ctx(t), declaredDlv(id, "billing", twoConsumers...)))
			assert.Contains(t, pendingIDs(t, store), id)
			require.NoError(t, store.Complete(ctx(t), declaredDlv(id, "shipping", twoConsumers...)))
			s.assertCompleted(t, store, mode, id)
		})
	})

	t.Run("ARecordCompletedBeforeStaysComplete", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		id := insert(t, store, records("orders", 1))[0].ID
		require.NoError(t, store.Complete(ctx(t), consumerDlv(id, "consume")), "the old single receiver")
		err := store.CheckPending(ctx(t), declaredDlv(id, "billing", twoConsumers...))
		assert.ErrorIs(t, err, recordstore.ErrNotPending, "not a conflict: the topic declares its consumers now")
		assert.ErrorIs(t, store.Complete(ctx(t), declaredDlv(id, "billing", twoConsumers...)), recordstore.ErrNotPending)
		assert.Empty(t, s.in.Deliveries(t, store, id), "a complete record is not adopted")
		assert.Empty(t, pendingIDs(t, store))
	})

	t.Run("FailuresAreTheConsumersOwn", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			fr := need[recordstore.FailureRecorder](t, store)
			id := insert(t, store, records("orders", 1))[0].ID
			billing, shipping := declaredDlv(id, "billing", twoConsumers...), declaredDlv(id, "shipping", twoConsumers...)
			_, abandoned, err := fr.RecordFailure(ctx(t), billing, "poison", 1, func(int) time.Duration { return time.Hour })
			require.NoError(t, err)
			require.True(t, abandoned, "billing's delivery is abandoned")
			require.NoError(t, store.CheckPending(ctx(t), shipping), "shipping's is pending and due")
			require.NoError(t, store.Complete(ctx(t), shipping))
			got, found := s.in.Record(t, store, id)
			require.True(t, found)
			assert.Equal(t, Abandoned, got.State, "abandoned once no delivery is pending")
			assert.Equal(t, []StoredDelivery{
				{Consumer: "billing", State: Abandoned, Attempts: 1, LastError: "poison"},
				{Consumer: "shipping", State: Completed},
			}, s.in.Deliveries(t, store, id))
		})
	})

	t.Run("EachDeclaredConsumerHoldsItsOwnLease", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store, _ := s.leased(t, mode, time.Hour)
			id := insert(t, store, records("orders", 1))[0].ID
			require.NoError(t, store.CheckPending(ctx(t), withLease(declaredDlv(id, "billing", twoConsumers...), "billing-1")))
			require.NoError(t, store.CheckPending(ctx(t), withLease(declaredDlv(id, "shipping", twoConsumers...), "shipping-1")),
				"the record is not leased as a whole")
			assert.ErrorIs(t, store.CheckPending(ctx(t), withLease(declaredDlv(id, "billing", twoConsumers...), "billing-2")), recordstore.ErrLeased)
		})
	})
}

// testRetire: [recordstore.ConsumerRetirer].
func (s *contract) testRetire(t *testing.T) {
	t.Run("CompletesTheConsumersDeliveriesAndRollsUp", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			r := need[recordstore.ConsumerRetirer](t, store)
			recs := insert(t, store, withConsumers(3, twoConsumers...))
			waiting := insert(t, store, withConsumers(1, twoConsumers...))[0].ID
			payment := records("payments", 1)
			payment[0].Consumers = twoConsumers
			paid := insert(t, store, payment)[0].ID
			for _, rec := range recs {
				require.NoError(t, store.Complete(ctx(t), consumerDlv(rec.ID, "billing")))
			}
			require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[0].ID, "shipping")))

			n, err := r.Retire(ctx(t), "orders", "shipping")
			require.NoError(t, err)
			assert.Equal(t, 3, n, "the pending deliveries of shipping")
			for _, rec := range recs {
				s.assertCompleted(t, store, mode, rec.ID)
			}
			assert.Equal(t, []int64{waiting}, pendingIDs(t, store), "billing has still to complete this one")
			require.NoError(t, store.CheckPending(ctx(t), consumerDlv(waiting, "billing")))
			require.NoError(t, store.CheckPending(ctx(t), recordstore.Delivery{ID: paid, Topic: "payments", Consumer: "shipping"}), "another topic's are not touched")

			n, err = r.Retire(ctx(t), "orders", "shipping")
			require.NoError(t, err)
			assert.Zero(t, n, "nothing left to retire")
		})
	})

	t.Run("MoreThanOneBatch", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Delete)
		r := need[recordstore.ConsumerRetirer](t, store)
		const n = 450
		insert(t, store, withConsumers(n, twoConsumers...))
		got, err := r.Retire(ctx(t), "orders", "shipping")
		require.NoError(t, err)
		assert.Equal(t, n, got)
		assert.Len(t, pendingIDs(t, store), n, "pending for billing")
		got, err = r.Retire(ctx(t), "orders", "billing")
		require.NoError(t, err)
		assert.Equal(t, n, got)
		assert.Empty(t, pendingIDs(t, store))
		assert.Zero(t, s.rowCount(t, store))
	})
}
