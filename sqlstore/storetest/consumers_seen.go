package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

// unchecked is what a store reports as unchecked for n records that wait
// for a receiver never seen: n, or 0 on a store that remembers no
// receivers.
func unchecked(store recordstore.Store, n int64) int64 {
	if _, ok := store.(recordstore.ConsumerRecorder); ok {
		return n
	}
	return 0
}

// pendingStatus reads the pending status and the full one, which must
// agree on every receiver field, and returns the pending one by topic.
func pendingStatus(t *testing.T, sr recordstore.StatusReader) map[string]recordstore.TopicStatus {
	t.Helper()
	pending, err := sr.PendingStatus(ctx(t))
	require.NoError(t, err)
	full, err := sr.Status(ctx(t))
	require.NoError(t, err)
	require.Len(t, full, len(pending), "both statuses list the topics seen")
	out := map[string]recordstore.TopicStatus{}
	for i, st := range pending {
		assert.Equal(t, st.Topic, full[i].Topic)
		assert.Equal(t, st.Unchecked, full[i].Unchecked, "%s: Status and PendingStatus count the same unchecked records", st.Topic)
		assert.Equal(t, st.Seen, full[i].Seen, st.Topic)
		out[st.Topic] = st
	}
	return out
}

// seenStore is a fresh store in the mode as a ConsumerRecorder and a
// StatusReader, skipping the test when it is not both.
func (s *contract) seenStore(t *testing.T, mode Completion) (recordstore.Store, recordstore.ConsumerRecorder, recordstore.StatusReader) {
	t.Helper()
	store := s.store(t, mode)
	return store, need[recordstore.ConsumerRecorder](t, store), need[recordstore.StatusReader](t, store)
}

// testConsumersSeen: the consumers a store has seen, and the pending
// records that wait for one never seen ([recordstore.ConsumerRecorder]).
func (s *contract) testConsumersSeen(t *testing.T) {
	t.Run("OneConsumerNeverSeen", func(t *testing.T) {
		t.Parallel()
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store, cr, sr := s.seenStore(t, mode)
			insert(t, store, records("orders", 2))
			orders := pendingStatus(t, sr)["orders"]
			assert.Equal(t, int64(2), orders.Unchecked, "no receiver of the topic was ever seen: every pending record is unchecked")
			assert.False(t, orders.Seen)
			assert.Zero(t, orders.SinceSeen)

			require.NoError(t, cr.SawConsumer(ctx(t), "orders", consumer))
			require.NoError(t, cr.SawConsumer(ctx(t), "orders", consumer), "seeing a consumer again updates it")
			orders = pendingStatus(t, sr)["orders"]
			assert.Equal(t, int64(2), orders.Pending)
			assert.Zero(t, orders.Unchecked, "its receiver was seen")
			assert.True(t, orders.Seen)
			assert.Less(t, orders.SinceSeen, time.Minute, "last seen by the database clock")
			assert.Nil(t, orders.Consumers)
		})
	})
	t.Run("ConsumersSeenArePerTopic", func(t *testing.T) {
		t.Parallel()
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store, cr, sr := s.seenStore(t, mode)
			insert(t, store, records("orders", 1))
			require.NoError(t, cr.SawConsumer(ctx(t), "refunds", consumer))
			got := pendingStatus(t, sr)
			assert.Equal(t, int64(1), got["orders"].Unchecked, "a receiver of another topic checks none of these")
			refunds, ok := got["refunds"]
			require.True(t, ok, "a topic seen is listed without records")
			assert.Equal(t, recordstore.TopicStatus{Topic: "refunds", Seen: true, SinceSeen: refunds.SinceSeen}, refunds)
		})
	})
	t.Run("DeclaredConsumerNeverSeen", func(t *testing.T) {
		t.Parallel()
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store, cr, sr := s.seenStore(t, mode)
			recs := insert(t, store, withConsumers(3, twoConsumers...))
			require.NoError(t, cr.SawConsumer(ctx(t), "orders", "billing"))
			require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[0].ID, "billing")))
			require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[1].ID, "billing")))

			orders := pendingStatus(t, sr)["orders"]
			assert.Equal(t, int64(3), orders.Pending)
			assert.Equal(t, int64(3), orders.Unchecked, "every record waits for shipping, never seen")
			assert.True(t, orders.Seen, "billing was")
			require.Len(t, orders.Consumers, 2)
			billing, shipping := orders.Consumers[0], orders.Consumers[1]
			assert.Equal(t, int64(1), billing.Pending)
			assert.Zero(t, billing.Unchecked)
			assert.True(t, billing.Seen)
			assert.Equal(t, int64(3), shipping.Unchecked, "a consumer never seen: its pending deliveries")
			assert.False(t, shipping.Seen)

			require.NoError(t, cr.SawConsumer(ctx(t), "orders", "shipping"))
			orders = pendingStatus(t, sr)["orders"]
			assert.Zero(t, orders.Unchecked)
			assert.Zero(t, orders.Consumers[1].Unchecked)
			assert.True(t, orders.Consumers[1].Seen)
		})
	})
	t.Run("TwoConsumersNeverSeen", func(t *testing.T) {
		t.Parallel()
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store, cr, sr := s.seenStore(t, mode)
			recs := insert(t, store, withConsumers(3, "audit", "billing", "shipping"))
			require.NoError(t, cr.SawConsumer(ctx(t), "orders", "audit"))
			for _, r := range recs {
				require.NoError(t, store.Complete(ctx(t), consumerDlv(r.ID, "audit")))
			}
			// Completed by hand (an operator's tool) for one consumer each:
			// record 0 waits for shipping, 1 for billing, 2 for both.
			require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[0].ID, "billing")))
			require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[1].ID, "shipping")))

			orders := pendingStatus(t, sr)["orders"]
			assert.Equal(t, int64(3), orders.Pending)
			assert.Equal(t, int64(3), orders.Unchecked, "each record once, whichever consumers it waits for")
			byConsumer := map[string]int64{}
			for _, cs := range orders.Consumers {
				byConsumer[cs.Consumer] = cs.Unchecked
			}
			assert.Equal(t, map[string]int64{"billing": 2, "shipping": 2}, byConsumer, "audit has nothing pending")
		})
	})
}
