package outbox_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
)

// droppingPublisher loses the first n messages it is given, as a broker
// that drops them does, and sends the rest.
type droppingPublisher struct {
	message.Publisher
	drop atomic.Int32
}

func (p *droppingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.drop.Add(-1) >= 0 {
		return nil
	}
	return p.Publisher.Publish(topic, msgs...)
}

// TestRemoteConsumersLostCopiesAreSentAgainWithinAMinute: service A, with a
// database of its own and every default, publishes "orders" to remote
// consumer "billing" in service B, which has its own database and inbox,
// over one GoChannel (which, like a queue not declared yet, loses what is
// sent while nobody subscribes). A copy that never reached B, or whose
// confirmation was lost, is sent again after A's confirmation window (30 s)
// rather than its stale resubmitter's five minutes, and each message is
// handled once. Every database: on PostgreSQL A has every default; on the
// others, whose part is B's inbox, a 1 s window, so that the suite does not
// wait 30 s four more times.
func TestRemoteConsumersLostCopiesAreSentAgainWithinAMinute(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		var window []peerOption
		if b.Name != "Postgres" {
			window = append(window, withReplay(outbox.ReplayConfig{Resubmit: outbox.StaleResubmitterConfig{ConfirmWithin: time.Second}}))
		}
		t.Run("CopiesSentBeforeTheReceiverSubscribes", func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			rdb := newReceiverDB(t, b)
			a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}}, outbox.MiddlewareConfig{}, nil, window...)
			r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Inbox: rdb.inbox, Confirmations: broker})
			r.handle("billing", "orders", broker, func(msg *message.Message) error { return rdb.effect(msg, true) })
			a.start(t)
			uuids := publishN(t, a.pub, "orders", "order", 3)
			r.start(t) // subscribes after the three were sent, and lost

			a.waitDrained(t, ctx, "orders")
			ran := r.ran("billing")
			for _, u := range uuids {
				assert.Equal(t, 1, ran[u], "%s handled once", u)
			}
			assert.Equal(t, 3, rdb.count(t), "one effect each")
			var warned []testenv.LogEntry
			for _, e := range a.logger.Entries("info") {
				if strings.HasPrefix(e.Msg, "WARNING: Records of a topic with remote consumers were sent again") {
					warned = append(warned, e)
				}
			}
			require.NotEmpty(t, warned, "A warns that the remote consumer did not confirm")
			assert.Equal(t, "billing", warned[0].Fields["consumer"])
			assert.Equal(t, "never since this process started", warned[0].Fields["last_confirmed_ago"])
			a.stop(t)
			r.stop(t)
		})

		t.Run("ADroppedConfirmation", func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			rdb := newReceiverDB(t, b)
			confirmations := &droppingPublisher{Publisher: broker}
			confirmations.drop.Store(1)
			a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}}, outbox.MiddlewareConfig{}, nil, window...)
			r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Inbox: rdb.inbox, Confirmations: confirmations})
			r.handle("billing", "orders", broker, func(msg *message.Message) error { return rdb.effect(msg, true) })
			a.start(t)
			r.start(t)
			require.NoError(t, a.pub.Publish("orders", message.NewMessage("order-1", []byte("{}"))))

			a.waitDrained(t, ctx, "orders")
			assert.Equal(t, 1, r.ran("billing")["order-1"], "the copy sent again was skipped by B's inbox, and confirmed")
			assert.Equal(t, 1, rdb.count(t), "one effect")
			assert.Equal(t, 1, r.obs.get("duplicate"), "B skipped the second copy")
			a.stop(t)
			r.stop(t)
		})
	})
}

// TestTwoServicesConfirmingUnderOneNameAreReported: services B and C, each
// with a database and inbox of its own, both name their handler of A's
// "orders" "billing", the one remote consumer A declares, over one
// GoChannel. Each confirmation completes the delivery for both, so A
// reports, once, that two receiving services confirm under one name. Every
// database.
func TestTwoServicesConfirmingUnderOneNameAreReported(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		t.Cleanup(func() { _ = broker.Close() })
		a := newPeer(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}}, outbox.MiddlewareConfig{})
		a.start(t)
		for _, name := range []string{"B", "C"} {
			rdb := newReceiverDB(t, b)
			r := newPeer(t, b, name, broker, nil, outbox.MiddlewareConfig{Inbox: rdb.inbox, Confirmations: broker})
			r.handle("billing", "orders", broker, nil)
			r.start(t)
		}
		publishN(t, a.pub, "orders", "order", 3)
		a.waitHandled(t, ctx, 3)
		// Each message's second confirmation finds its delivery complete.
		require.Eventually(t, func() bool { return a.obs.get("duplicate") == 3 }, 30*time.Second, 10*time.Millisecond)

		var reports []testenv.LogEntry
		for _, e := range a.logger.Entries("error") {
			if strings.Contains(e.Msg, "Two receiving services") {
				reports = append(reports, e)
			}
		}
		require.Len(t, reports, 1, "reported once")
		assert.ErrorIs(t, reports[0].Err, outbox.ErrInvalidConfig)
		assert.Equal(t, "billing", reports[0].Fields["consumer"])
		assert.Contains(t, reports[0].Err.Error(), "unique across services")
	})
}
