package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// orderedReceiver is a receiving service's own database: its inbox, and
// the table its handler writes each message's effect to, with the effect's
// position among its key's, in one transaction with the inbox entry
// (outbox.InboxTx).
type orderedReceiver struct{ *receiverDB }

func newOrderedReceiver(t *testing.T, b testenv.Backend) *orderedReceiver {
	t.Helper()
	return &orderedReceiver{newReceiverDBWith(t, b, "k VARCHAR(64) NOT NULL, n INTEGER NOT NULL, pos INTEGER NOT NULL")}
}

// orderedServices are service A, which publishes "orders" ordered by key
// to remote consumer billing, and service B, billing's service, over one
// GoChannel, each with a database of its own; B's handler runs fail, or
// writes the effect when fail returns nil.
type orderedServices struct {
	a, r   *peer
	rdb    *orderedReceiver
	broker *gochannel.GoChannel
}

func startOrderedServices(t *testing.T, b testenv.Backend, tracked outbox.Tracked, cfg outbox.MiddlewareConfig, fail func(*message.Message) error,
	options ...peerOption) *orderedServices {
	t.Helper()
	s := &orderedServices{broker: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}), rdb: newOrderedReceiver(t, b)}
	t.Cleanup(func() { _ = s.broker.Close() })
	tracked.Topic, tracked.OrderKey = "orders", "order"
	if tracked.RemoteConsumers == nil {
		tracked.RemoteConsumers = []string{"billing"}
	}
	s.a = newPeerWith(t, b, "A", s.broker, []outbox.Tracked{tracked}, cfg, nil, append([]peerOption{quickConfirmations}, options...)...)
	s.r = newPeer(t, b, "B", s.broker, nil, outbox.MiddlewareConfig{Inbox: s.rdb.inbox, Confirmations: s.broker})
	s.r.handle("billing", "orders", keepOpen{s.broker}, func(msg *message.Message) error {
		if err := fail(msg); err != nil {
			return err
		}
		return s.rdb.apply(msg)
	})
	s.a.start(t)
	s.r.start(t)
	return s
}

func (s *orderedServices) stop(t *testing.T) {
	t.Helper()
	s.a.stop(t)
	s.r.stop(t)
}

// refuse fails every run of the message uuid.
func refuse(uuid string) func(*message.Message) error {
	return func(msg *message.Message) error {
		if msg.UUID == uuid {
			return fmt.Errorf("billing refuses %s", msg.UUID)
		}
		return nil
	}
}

// apply writes the effect of msg (its key and number) at the next position
// of its key, with its inbox entry, in one transaction, which it tries
// again when MySQL/MariaDB ends it to break a deadlock (the positions'
// INSERT … SELECT takes gap locks).
func (r *orderedReceiver) apply(msg *message.Message) error {
	for range 5 {
		err := r.applyOnce(msg)
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1213 {
			return err
		}
	}
	return r.applyOnce(msg)
}

func (r *orderedReceiver) applyOnce(msg *message.Message) error {
	ctx := msg.Context()
	tx, err := r.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := outbox.InboxTx(ctx, tx, msg); err != nil {
		return err
	}
	k := msg.Metadata.Get("order")
	n, err := strconv.Atoi(msg.Metadata.Get("n"))
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, r.db.Rebind("INSERT INTO "+r.effects+" (k, n, pos) SELECT ?, ?, COUNT(*) FROM "+r.effects+" WHERE k = ?"), k, n, k); err != nil {
		return err
	}
	return tx.Commit()
}

// byKey is each key's effects, numbers in the order of their positions.
func (r *orderedReceiver) byKey(t *testing.T) map[string][]int {
	t.Helper()
	rows, err := r.db.Query("SELECT k, n, pos FROM " + r.effects + " ORDER BY k, pos")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string][]int{}
	for rows.Next() {
		var k string
		var n, pos int
		require.NoError(t, rows.Scan(&k, &n, &pos))
		require.Equal(t, len(out[k]), pos, "key %s has two effects at one position", k)
		out[k] = append(out[k], n)
	}
	require.NoError(t, rows.Err())
	return out
}

// keyed is the n-th message of key k ("k%02d"), named "k%02d-%03d", with
// its key and number in the metadata.
func keyed(k, n int) *message.Message {
	msg := message.NewMessage(fmt.Sprintf("k%02d-%03d", k, n), []byte("{}"))
	msg.Metadata.Set("order", fmt.Sprintf("k%02d", k))
	msg.Metadata.Set("n", strconv.Itoa(n))
	return msg
}

// publishByKey publishes keys × perKey messages, a batch per number: each
// Publish holds the n-th message of every key, which GoChannel delivers
// each on a goroutine of its own, so out of order.
func publishByKey(t *testing.T, pub message.Publisher, topic string, keys, perKey int) {
	t.Helper()
	for n := range perKey {
		msgs := make([]*message.Message, keys)
		for k := range keys {
			msgs[k] = keyed(k, n)
		}
		require.NoError(t, pub.Publish(topic, msgs...))
	}
}

// inOrder returns the keys whose effects are not 0..perKey-1 in order.
func inOrder(got map[string][]int, keys, perKey int) []string {
	var bad []string
	for k := range keys {
		key := fmt.Sprintf("k%02d", k)
		ns := got[key]
		ok := len(ns) == perKey
		for i := 0; ok && i < len(ns); i++ {
			ok = ns[i] == i
		}
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: %v", key, ns))
		}
	}
	return bad
}

// slowResubmits is a replay whose stale resubmitter sends nothing within
// a test: it runs only so that order keys have a sender.
var slowResubmits = withReplay(outbox.ReplayConfig{Resubmit: outbox.StaleResubmitterConfig{
	OlderThan: time.Hour, ConfirmWithin: time.Hour, Interval: time.Hour}})

// heldLogs counts the messages a receiver held.
func heldLogs(l *testenv.CaptureLogger) int {
	n := 0
	for _, e := range l.Entries("debug") {
		if strings.Contains(e.Msg, "holding the message") {
			n++
		}
	}
	return n
}

// TestOrderByKeyAcrossServices: service A, with a database of its own,
// publishes "orders" ordered by key to remote consumer "billing" in
// service B, which has its own database and writes each effect with its
// inbox entry in one transaction (outbox.InboxTx). One GoChannel, which
// delivers the messages of a publish out of order; B's handler fails the
// first run of three messages in ten. Every database, for both services.
func TestOrderByKeyAcrossServices(t *testing.T) {
	t.Parallel()
	const keys, perKey = 8, 8
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		t.Run("EachKeyInTheOrderItWasSaved", func(t *testing.T) {
			ctx := testCtx(t)
			var mu sync.Mutex
			runs := map[string]int{}
			s := startOrderedServices(t, b, outbox.Tracked{}, outbox.MiddlewareConfig{MaxAttempts: 100}, func(msg *message.Message) error {
				mu.Lock()
				runs[msg.UUID]++
				first := runs[msg.UUID] == 1
				mu.Unlock()
				if n, _ := strconv.Atoi(msg.Metadata.Get("n")); first && (n*7+int(msg.UUID[2]))%10 < 3 {
					return fmt.Errorf("billing is down for %s", msg.UUID)
				}
				return nil
			})
			publishByKey(t, s.a.pub, "orders", keys, perKey)
			s.a.waitDrained(t, ctx, "orders")

			assert.Empty(t, inOrder(s.rdb.byKey(t), keys, perKey), "every key's effects in B's database, in the order A saved them")
			assert.Positive(t, heldLogs(s.r.logger), "B held messages whose earlier message it had not handled")
			assert.Positive(t, s.a.obs.get("failed"), "B's failures reached A")
			assert.Empty(t, s.a.logger.Entries("error"))
			s.stop(t)
		})

		t.Run("HeldMessagesAreSentAgainWithoutTheResubmitter", func(t *testing.T) {
			// A runs no stale resubmitter: each message B holds is sent
			// again by the confirmation of its key's earlier one.
			ctx := testCtx(t)
			s := startOrderedServices(t, b, outbox.Tracked{}, outbox.MiddlewareConfig{}, func(*message.Message) error { return nil },
				withReplay(outbox.ReplayConfig{NoResubmit: true}))
			// One Publish of every message; the broker brings k00's
			// first only once B held a message.
			pub, err := outbox.NewPublisher(s.a.reg, laterFirst{Publisher: s.broker, first: "k00-000", held: func() bool { return heldLogs(s.r.logger) > 0 }})
			require.NoError(t, err)
			var msgs []*message.Message
			for n := range perKey {
				for k := range keys {
					msgs = append(msgs, keyed(k, n))
				}
			}
			require.NoError(t, pub.Publish("orders", msgs...))
			s.a.waitDrained(t, ctx, "orders")
			assert.Empty(t, inOrder(s.rdb.byKey(t), keys, perKey))
			assert.Positive(t, heldLogs(s.r.logger), "B held messages whose earlier message it had not handled")
			s.stop(t)
		})

		t.Run("WithOrderSkipsAbandonedTheKeyGoesOnWithoutTheResubmitter", func(t *testing.T) {
			// k00's second message is abandoned at its first failure;
			// A's stale resubmitter waits an hour, so the abandonment
			// itself sends the key's next message again.
			ctx := testCtx(t)
			s := startOrderedServices(t, b, outbox.Tracked{OrderSkipsAbandoned: true}, outbox.MiddlewareConfig{MaxAttempts: 1}, refuse("k00-001"),
				slowResubmits)
			publishByKey(t, s.a.pub, "orders", 2, 4)
			s.a.waitHandled(t, ctx, 7)
			got := s.rdb.byKey(t)
			assert.Equal(t, []int{0, 2, 3}, got["k00"], "k00 goes on past its abandoned message, in order")
			assert.Equal(t, []int{0, 1, 2, 3}, got["k01"])
			s.stop(t)
		})

		t.Run("AnAbandonedMessageHoldsItsKey", func(t *testing.T) {
			// k00's second message always fails: abandoned after two
			// attempts, it holds the rest of k00 at B; the other keys
			// go on, and A's status shows the held key.
			ctx := testCtx(t)
			s := startOrderedServices(t, b, outbox.Tracked{}, outbox.MiddlewareConfig{MaxAttempts: 2}, refuse("k00-001"))
			publishByKey(t, s.a.pub, "orders", 3, 4)
			s.r.waitRan(t, ctx, "billing", []string{"k01-003", "k02-003"})
			require.Eventually(t, func() bool { return s.a.obs.get("abandoned") > 0 }, 30*time.Second, 10*time.Millisecond)
			status, err := s.a.store.Status(ctx)
			require.NoError(t, err)
			require.Len(t, status, 1)
			assert.Equal(t, int64(1), status[0].HeldKeys, "A's status shows k00 held")
			// The stale resubmitter sends k00's next message again, and B
			// holds it again each time.
			held := heldLogs(s.r.logger)
			require.Eventually(t, func() bool { return heldLogs(s.r.logger) >= held+2 }, 30*time.Second, 10*time.Millisecond)
			got := s.rdb.byKey(t)
			assert.Equal(t, []int{0}, got["k00"], "k00 stops at its abandoned message")
			assert.Equal(t, []int{0, 1, 2, 3}, got["k01"])
			assert.Equal(t, []int{0, 1, 2, 3}, got["k02"])
			s.stop(t)
		})

		t.Run("WithOrderSkipsAbandonedTheKeyGoesOn", func(t *testing.T) {
			ctx := testCtx(t)
			s := startOrderedServices(t, b, outbox.Tracked{OrderSkipsAbandoned: true}, outbox.MiddlewareConfig{MaxAttempts: 2}, refuse("k00-001"))
			publishByKey(t, s.a.pub, "orders", 3, 4)
			s.r.waitRan(t, ctx, "billing", []string{"k00-003", "k01-003", "k02-003"})
			s.a.waitHandled(t, ctx, 11)
			got := s.rdb.byKey(t)
			assert.Equal(t, []int{0, 2, 3}, got["k00"], "k00 goes on past its abandoned message, in order")
			assert.Equal(t, []int{0, 1, 2, 3}, got["k01"])
			assert.Equal(t, []int{0, 1, 2, 3}, got["k02"])
			s.stop(t)
		})
	})
}

// TestOrderedMessageToAReceiverWithoutAnInbox: B keeps no inbox, so it
// cannot hold a message for an earlier one; it handles each as it comes,
// and its log says so once.
func TestOrderedMessageToAReceiverWithoutAnInbox(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[1]
	ctx := testCtx(t)
	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = broker.Close() })
	a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}, OrderKey: "order"}},
		outbox.MiddlewareConfig{}, nil, slowResubmits)
	r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Confirmations: broker})
	var ran atomic.Int32
	r.handle("billing", "orders", broker, func(*message.Message) error { ran.Add(1); return nil })
	a.start(t)
	r.start(t)
	// One Publish: the second and third name the first, still pending.
	require.NoError(t, a.pub.Publish("orders", keyed(0, 0), keyed(0, 1), keyed(0, 2)))
	a.waitDrained(t, ctx, "orders")
	assert.Equal(t, int32(3), ran.Load())
	errs := r.logger.Entries("error")
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0].Msg, "keeps no inbox")
	a.stop(t)
	r.stop(t)
}

// TestOrderedMessageReleasedWhenTheInboxLostTheEarlierEntry: A publishes
// "orders" ordered by key to remote consumers billing (service B) and
// shipping (service C, not running), each with a database of its own. B
// handles k00's first message, which stays pending at A for shipping, and
// its inbox then loses that entry (cleaned by its retention). B restarts,
// so that nothing of its process remembers the message, and receives k00's
// second: it holds it, and A, which finds nothing earlier holding billing,
// sends it again released for billing, which runs it. A's stale
// resubmitter waits its default time, so that no copy of the first, sent
// for shipping, reaches B, whose inbox no longer knows it.
func TestOrderedMessageReleasedWhenTheInboxLostTheEarlierEntry(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		s := startOrderedServices(t, b, outbox.Tracked{RemoteConsumers: []string{"billing", "shipping"}}, outbox.MiddlewareConfig{},
			func(*message.Message) error { return nil }, withReplay(outbox.ReplayConfig{}))
		a, r, rdb, broker := s.a, s.r, s.rdb, s.broker
		publishByKey(t, a.pub, "orders", 1, 1)
		a.waitHandled(t, ctx, 1)
		r.stop(t)
		_, err := rdb.db.ExecContext(ctx, rdb.db.Rebind("DELETE FROM "+rdb.inbox.Table()+" WHERE message_uuid = ?"), "k00-000")
		require.NoError(t, err)

		r2 := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Inbox: rdb.inbox, Confirmations: broker})
		r2.handle("billing", "orders", broker, func(msg *message.Message) error { return rdb.apply(msg) })
		r2.start(t)
		confirmations, err := broker.Subscribe(ctx, outbox.DefaultConfirmTopic)
		require.NoError(t, err)
		require.NoError(t, a.pub.Publish("orders", keyed(0, 1)))
		r2.waitRan(t, ctx, "billing", []string{"k00-001"})
		a.waitHandled(t, ctx, 2)

		assert.Equal(t, map[string]int{"k00-001": 1}, r2.ran("billing"), "held unrun once, then run once released")
		assert.Equal(t, 1, heldLogs(r2.logger))
		assert.Equal(t, []int{0, 1}, rdb.byKey(t)["k00"])
		recs, err := a.store.PendingAfter(ctx, "orders", 0, 10)
		require.NoError(t, err)
		assert.Len(t, recs, 2, "both wait for shipping")
		// B's report that it held the message names the record by
		// held_id, with id 0: a sender of v0.1.0, which requires a
		// positive id, refuses it rather than completing the delivery.
		var held map[string]any
		for held == nil {
			select {
			case c := <-confirmations:
				c.Ack()
				var fields map[string]any
				require.NoError(t, json.Unmarshal(c.Payload, &fields))
				if fields["held_id"] != nil {
					held = fields
				}
			case <-ctx.Done():
				t.Fatal("no held confirmation seen")
			}
		}
		assert.Equal(t, float64(0), held["id"])
		assert.Equal(t, float64(recs[1].ID), held["held_id"])
		assert.Equal(t, "k00", held["key"])
		a.stop(t)
		r2.stop(t)
	})
}

// keepOpen is a subscriber its router does not close.
type keepOpen struct{ message.Subscriber }

func (keepOpen) Close() error { return nil }

// failingPredecessors is a store whose first reads of the earlier messages
// of order keys fail.
type failingPredecessors struct {
	*sqlstore.Store
	fails atomic.Int32
}

func (f *failingPredecessors) PredecessorMessages(ctx context.Context, topic string, ids []int64, skip bool) (map[int64]recordstore.Predecessor, error) {
	if f.fails.Add(-1) >= 0 {
		return nil, errors.New("connection reset by peer")
	}
	return f.Store.PredecessorMessages(ctx, topic, ids, skip)
}

// TestOrderedPublishWhoseEarlierMessagesCannotBeRead: A's read of the
// earlier messages of a publish's keys fails after its records were saved.
// The publish succeeds (the records are saved) and sends the messages
// without a key only; the stale resubmitter sends the others, stamped, and
// B handles every key in order.
func TestOrderedPublishWhoseEarlierMessagesCannotBeRead(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[0]
	ctx := testCtx(t)
	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = broker.Close() })
	rdb := newOrderedReceiver(t, b)
	var store *failingPredecessors
	a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}, OrderKey: "order"}},
		outbox.MiddlewareConfig{}, func(s *sqlstore.Store) recordstore.Store {
			store = &failingPredecessors{Store: s}
			store.fails.Store(1)
			return store
		}, quickConfirmations)
	r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Inbox: rdb.inbox, Confirmations: broker})
	var unkeyed atomic.Int32
	r.handle("billing", "orders", broker, func(msg *message.Message) error {
		if msg.Metadata.Get("order") == "" {
			unkeyed.Add(1)
			return nil
		}
		return rdb.apply(msg)
	})
	a.start(t)
	r.start(t)
	msgs := []*message.Message{message.NewMessage("plain", []byte("{}"))}
	for n := range 3 {
		msgs = append(msgs, keyed(0, n))
	}
	require.NoError(t, a.pub.Publish("orders", msgs...), "the records are saved: the publish succeeded")
	a.waitDrained(t, ctx, "orders")
	assert.Equal(t, int32(1), unkeyed.Load())
	assert.Equal(t, []int{0, 1, 2}, rdb.byKey(t)["k00"])
	errs := a.logger.Entries("error")
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0].Msg, "left to the stale resubmitter")
	a.stop(t)
	r.stop(t)
}

// TestTransactionalPublishOfKeysReachesRemoteConsumersInOrder: service A
// publishes "orders" ordered by key in its own transactions
// (outbox.TxPublisher, one transaction per number, every key in it),
// sending each once committed; B, with a database of its own, handles every
// key in order over one GoChannel that reorders the messages of a publish.
func TestTransactionalPublishOfKeysReachesRemoteConsumersInOrder(t *testing.T) {
	t.Parallel()
	const keys, perKey = 5, 5
	b := testenv.Backends()[0]
	ctx := testCtx(t)
	s := startOrderedServices(t, b, outbox.Tracked{}, outbox.MiddlewareConfig{}, func(*message.Message) error { return nil })
	txPub, err := outbox.NewTxPublisher(s.a.reg, s.broker)
	require.NoError(t, err)
	for n := range perKey {
		tx, err := s.a.store.DB().BeginTx(ctx, nil)
		require.NoError(t, err)
		msgs := make([]*message.Message, keys)
		for k := range keys {
			msgs[k] = keyed(k, n)
		}
		send, err := txPub.PublishTx(ctx, tx, "orders", msgs...)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		require.NoError(t, send())
	}
	s.a.waitDrained(t, ctx, "orders")
	assert.Empty(t, inOrder(s.rdb.byKey(t), keys, perKey))
	s.stop(t)
}
