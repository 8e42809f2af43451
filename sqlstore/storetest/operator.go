package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func (s *suite) testOperator(t *testing.T) {
	t.Run("ListGetAndMakeDue", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, records("orders", 4))
			require.NoError(t, store.Complete(ctx(t), dlv(recs[0].ID)))
			_, _, err := store.RecordFailure(ctx(t), dlv(recs[1].ID), "poison", 1, nil)
			require.NoError(t, err)

			pending, err := store.Operator().List(ctx(t), sqlstore.RecordFilter{}, 0, 10, 0)
			require.NoError(t, err)
			require.Len(t, pending, 2)
			assert.Equal(t, recs[2].ID, pending[0].ID)
			assert.Equal(t, sqlstore.Pending, pending[0].State)
			assert.Less(t, pending[0].Age, time.Hour)
			assert.False(t, pending[0].Resent, "only the publish that saved it sent it")
			assert.False(t, pending[0].Due)
			assert.Equal(t, pending[0].Age, pending[0].SinceSent)
			page, err := store.Operator().List(ctx(t), sqlstore.RecordFilter{}, recs[2].ID, 10, 0)
			require.NoError(t, err)
			assert.Equal(t, []int64{recs[3].ID}, claimedIDs(infosRecords(page)), "pages by id")

			abandoned, err := store.Operator().List(ctx(t), sqlstore.RecordFilter{State: sqlstore.Abandoned}, 0, 10, 0)
			require.NoError(t, err)
			require.Len(t, abandoned, 1)
			assert.Equal(t, "poison", abandoned[0].LastError)
			assert.Equal(t, 1, abandoned[0].Attempts)

			got, err := store.Operator().Get(ctx(t), recs[1].ID)
			require.NoError(t, err)
			assert.Equal(t, sqlstore.Abandoned, got.State)
			assert.Equal(t, recs[1].Payload, got.Payload)
			assert.Equal(t, recs[1].Metadata, got.Metadata)
			_, err = store.Operator().Get(ctx(t), neverID)
			assert.ErrorIs(t, err, sqlstore.ErrRecordNotFound)
			_, err = store.Operator().List(ctx(t), sqlstore.RecordFilter{State: "stuck"}, 0, 10, 0)
			assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)

			ids, err := store.Operator().MakeDue(ctx(t), 0, 10, true)
			require.NoError(t, err)
			assert.Equal(t, []int64{recs[2].ID, recs[3].ID}, ids)
			claimed, err := store.ClaimStale(ctx(t), "orders", 0, time.Hour, 10)
			require.NoError(t, err)
			assert.Empty(t, claimed, "a dry run changes nothing")
			ids, err = store.Operator().MakeDue(ctx(t), 0, 1, false)
			require.NoError(t, err)
			assert.Equal(t, []int64{recs[2].ID}, ids)
			got, err = store.Operator().Get(ctx(t), recs[2].ID)
			require.NoError(t, err)
			assert.True(t, got.Due, "made due and not sent since")
			assert.Zero(t, got.SinceSent, "a made-due record has no age of last send")
			claimed, err = store.ClaimStale(ctx(t), "orders", 0, time.Hour, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{recs[2].ID}, claimedIDs(claimed), "a due record goes to the next resubmit round")
			got, err = store.Operator().Get(ctx(t), recs[2].ID)
			require.NoError(t, err)
			assert.True(t, got.Resent, "the resubmit round sent it")
			assert.False(t, got.Due)
			assert.Less(t, got.SinceSent, time.Hour)

			require.NoError(t, store.Operator().RequeueLater(ctx(t), recs[1].ID))
			claimed, err = store.ClaimStale(ctx(t), "orders", 0, time.Hour, 10)
			require.NoError(t, err)
			assert.Equal(t, []int64{recs[1].ID}, claimedIDs(claimed))
			assert.ErrorIs(t, store.Operator().RequeueLater(ctx(t), recs[1].ID), recordstore.ErrNotAbandoned)
		})
	})

	t.Run("ListShowsEachDelivery", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			id := insert(t, store, withConsumers(1, twoConsumers...))[0].ID
			billing, shipping := consumerDlv(id, "billing"), consumerDlv(id, "shipping")
			for _, f := range []struct {
				d      recordstore.Delivery
				reason string
			}{{billing, "boom"}, {shipping, "other boom"}, {billing, "last boom"}} {
				_, _, err := store.RecordFailure(ctx(t), f.d, f.reason, 2, nil)
				require.NoError(t, err)
			}
			require.NoError(t, store.Complete(ctx(t), shipping))

			abandonedRecs, err := store.Operator().List(ctx(t), sqlstore.RecordFilter{State: sqlstore.Abandoned}, 0, 10, 0)
			require.NoError(t, err)
			require.Len(t, abandonedRecs, 1)
			info := abandonedRecs[0]
			assert.Equal(t, id, info.ID)
			assert.Equal(t, []recordstore.DeliveryInfo{
				{Consumer: "billing", State: sqlstore.Abandoned, Attempts: 2, LastError: "last boom"},
				{Consumer: "shipping", State: sqlstore.Completed, Attempts: 1, LastError: "other boom"},
			}, info.Deliveries, "the operator sees each delivery")
		})
	})
	t.Run("ListByTopicAndConsumer", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			refund := insert(t, store, records("refunds", 1))[0].ID
			recs := insert(t, store, withConsumers(3, twoConsumers...))
			a, b, c := recs[0].ID, recs[1].ID, recs[2].ID
			abandon := func(id int64) {
				_, abandoned, err := store.RecordFailure(ctx(t), consumerDlv(id, "billing"), "boom", 1, nil)
				require.NoError(t, err)
				require.True(t, abandoned)
			}
			abandon(a) // pending for shipping
			require.NoError(t, store.Complete(ctx(t), consumerDlv(b, "billing")))
			abandon(c)
			require.NoError(t, store.Complete(ctx(t), consumerDlv(c, "shipping"))) // abandoned

			list := func(f sqlstore.RecordFilter, after int64, limit, maxBytes int) []int64 {
				t.Helper()
				infos, err := store.Operator().List(ctx(t), f, after, limit, maxBytes)
				require.NoError(t, err)
				return claimedIDs(infosRecords(infos))
			}
			assert.Equal(t, []int64{refund, a, b}, list(sqlstore.RecordFilter{}, 0, 10, 0), "every topic")
			assert.Equal(t, []int64{a, b}, list(sqlstore.RecordFilter{Topic: "orders"}, 0, 10, 0))
			assert.Equal(t, []int64{c}, list(sqlstore.RecordFilter{Topic: "orders", State: sqlstore.Abandoned}, 0, 10, 0))
			assert.Empty(t, list(sqlstore.RecordFilter{Topic: "orders", Consumer: "billing"}, 0, 10, 0), "billing has nothing pending")
			assert.Equal(t, []int64{a, b}, list(sqlstore.RecordFilter{Topic: "orders", Consumer: "shipping"}, 0, 10, 0))
			billing := sqlstore.RecordFilter{Topic: "orders", Consumer: "billing", State: sqlstore.Abandoned}
			assert.Equal(t, []int64{a, c}, list(billing, 0, 10, 0), "a pending record and an abandoned one")
			assert.Equal(t, []int64{a}, list(billing, 0, 1, 0), "the limit")
			assert.Equal(t, []int64{a}, list(billing, 0, 10, 1), "the byte budget")
			assert.Equal(t, []int64{c}, list(billing, a, 10, 0), "pages by id")

			for _, f := range []sqlstore.RecordFilter{{Topic: "orders", State: sqlstore.Completed}, {Consumer: "billing"}} {
				_, err := store.Operator().List(ctx(t), f, 0, 10, 0)
				assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig, "%+v", f)
			}
		})
	})
}

func infosRecords(infos []recordstore.RecordInfo) []recordstore.Record {
	out := make([]recordstore.Record, len(infos))
	for i, r := range infos {
		out[i] = r.Record
	}
	return out
}
