package outbox_test

import (
	"context"
	"sync"
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
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// checkCounter is a real store that counts its checks.
type checkCounter struct {
	*sqlstore.Store
	checks atomic.Int64
}

func (c *checkCounter) CheckPending(ctx context.Context, d recordstore.Delivery) error {
	c.checks.Add(1)
	return c.Store.CheckPending(ctx, d)
}

// firstCopyCase is one service on one table, its publisher and a
// middleware with its defaults, which skip the check of first copies.
type firstCopyCase struct {
	b     *bundle
	store *checkCounter
	reg   *outbox.Registry
	pub   message.Publisher
	sent  <-chan *message.Message
	mw    message.HandlerMiddleware
	mu    sync.Mutex
	runs  map[string]int // consumer/uuid -> handler runs
}

func newFirstCopyCase(t *testing.T, backend testenv.Backend, tracked outbox.Tracked, store *sqlstore.Store) *firstCopyCase {
	b := setup(t, backend, sqlstore.Mark)
	if store == nil {
		store = b.store
	}
	c := &firstCopyCase{b: b, store: &checkCounter{Store: store}, runs: map[string]int{}}
	tracked.Topic, tracked.Store = b.topic, c.store
	reg, err := outbox.NewRegistry(tracked)
	require.NoError(t, err)
	c.reg = reg
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	c.sent, err = gc.Subscribe(b.ctx(t), b.topic)
	require.NoError(t, err)
	c.mw, err = outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, b.logger)
	require.NoError(t, err)
	c.pub, err = outbox.NewPublisher(reg, gc)
	require.NoError(t, err)
	return c
}

// publish publishes one message and returns the copy the broker sent.
func (c *firstCopyCase) publish(t *testing.T) *message.Message {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), []byte("payload"))
	msg.Metadata.Set("order", "k")
	require.NoError(t, c.pub.Publish(c.b.topic, msg))
	got := <-c.sent
	got.Ack()
	return got
}

// deliver hands a copy of msg to consumer's handler.
func (c *firstCopyCase) deliver(t *testing.T, consumer string, msg *message.Message) {
	t.Helper()
	cp := msg.Copy()
	cp.SetContext(context.Background())
	_, err := c.mw(func(m *message.Message) ([]*message.Message, error) {
		c.mu.Lock()
		c.runs[consumer+"/"+m.UUID]++
		c.mu.Unlock()
		return nil, nil
	})(cp)
	require.NoError(t, err)
	require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), c.reg))
}

// TestFirstCopiesRunUnchecked: the defaults; one service, one table. The first copy of a record
// this process published runs without the check, once per consumer; every
// other copy is checked: a second copy of a completed record is skipped, a
// forged copy is refused, and a record of another process is checked. On
// a topic with an order key, a first copy runs unchecked when no earlier
// record of its key waited as it was saved, or the one that did completed
// here. A store with a lease checks every copy.
func TestFirstCopiesRunUnchecked(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		t.Run("OneHandler", func(t *testing.T) {
			c := newFirstCopyCase(t, backend, outbox.Tracked{}, nil)
			msg := c.publish(t)
			c.deliver(t, "h", msg)
			assert.Zero(t, c.store.checks.Load(), "the first copy is not checked")
			assert.Zero(t, c.b.pendingCount(t), "and completed")
			c.deliver(t, "h", msg)
			assert.Equal(t, int64(1), c.store.checks.Load(), "the second copy is checked")
			assert.Equal(t, 1, c.runs["h/"+msg.UUID], "and skipped: the record is complete")

			forged := c.publish(t)
			forged.UUID = watermill.NewUUID()
			c.deliver(t, "h", forged)
			assert.Zero(t, c.runs["h/"+forged.UUID], "a copy naming the record with another UUID is checked and refused")
			assert.Equal(t, 1, c.b.pendingCount(t), "the record stays pending for its own message")
		})
		t.Run("TwoDeclaredConsumers", func(t *testing.T) {
			b := setup(t, backend, sqlstore.Mark)
			store := &checkCounter{Store: b.store}
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store, Consumers: []string{"billing", "shipping"}})
			require.NoError(t, err)
			skipped := &signalLogger{msg: "Record already completed, acking copy without handling", hit: make(chan struct{}, 4)}
			mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, skipped)
			require.NoError(t, err)
			// Publish returns once both handlers acked; their completions
			// run in the background.
			gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 4, BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			ctx := b.ctx(t)
			ran := routeConsumers(t, ctx, mw, gc, b.topic, []string{"billing", "shipping"}, 4)

			pub, err := outbox.NewPublisher(reg, gc)
			require.NoError(t, err)
			msg := message.NewMessage(watermill.NewUUID(), []byte("payload"))
			require.NoError(t, pub.Publish(b.topic, msg))
			got := map[string]bool{<-ran: true, <-ran: true}
			assert.Equal(t, map[string]bool{"billing": true, "shipping": true}, got)
			assert.Zero(t, store.checks.Load(), "each consumer's first copy is not checked")
			require.NoError(t, reg.WaitCompletions(ctx))

			// A second copy for both: checked, and skipped by each.
			require.NoError(t, gc.Publish(b.topic, msg.Copy()))
			<-skipped.hit
			<-skipped.hit
			assert.Equal(t, int64(2), store.checks.Load())
			assert.Empty(t, ran, "no handler ran the second copy")
			assert.Zero(t, b.pendingCount(t))
		})
		t.Run("AnotherProcesssRecord", func(t *testing.T) {
			c := newFirstCopyCase(t, backend, outbox.Tracked{}, nil)
			// Another process: its own registry and publisher on the table.
			other, err := outbox.NewRegistry(outbox.Tracked{Topic: c.b.topic, Store: c.b.store})
			require.NoError(t, err)
			gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			sent, err := gc.Subscribe(c.b.ctx(t), c.b.topic)
			require.NoError(t, err)
			pub, err := outbox.NewPublisher(other, gc)
			require.NoError(t, err)
			require.NoError(t, pub.Publish(c.b.topic, message.NewMessage(watermill.NewUUID(), []byte("x"))))
			msg := <-sent
			msg.Ack()
			c.deliver(t, "h", msg)
			assert.Equal(t, int64(1), c.store.checks.Load())
			assert.Zero(t, c.b.pendingCount(t))
		})
		t.Run("OrderedTopic", func(t *testing.T) {
			c := newFirstCopyCase(t, backend, outbox.Tracked{OrderKey: "order"}, nil)
			one := c.publish(t)
			c.deliver(t, "h", one)
			assert.Zero(t, c.store.checks.Load(), "no earlier record of its key waited when it was saved")
			two, three := c.publish(t), c.publish(t)
			c.deliver(t, "h", three)
			assert.Equal(t, int64(1), c.store.checks.Load(), "record 3 waits for record 2, which did not run here: checked, and held")
			assert.Zero(t, c.runs["h/"+three.UUID])
			c.deliver(t, "h", two)
			assert.Equal(t, int64(1), c.store.checks.Load(), "record 2 waited for nothing")
			four := c.publish(t)
			c.deliver(t, "h", four)
			assert.Equal(t, int64(2), c.store.checks.Load(), "record 4 waits for record 3, which did not run here: checked")
			five := c.publish(t)
			c.deliver(t, "h", five)
			assert.Equal(t, int64(3), c.store.checks.Load())
			c.deliver(t, "h", one)
			assert.Equal(t, int64(4), c.store.checks.Load(), "a second copy is checked")
			assert.Equal(t, 1, c.runs["h/"+one.UUID])
		})
		t.Run("OrderedTopicAfterARecordThatRanHere", func(t *testing.T) {
			c := newFirstCopyCase(t, backend, outbox.Tracked{OrderKey: "order"}, nil)
			one, two := c.publish(t), c.publish(t)
			c.deliver(t, "h", one)
			c.deliver(t, "h", two)
			assert.Zero(t, c.store.checks.Load(), "record 2 waited for record 1 only, which completed here")
			assert.Equal(t, 1, c.runs["h/"+two.UUID])
			assert.Zero(t, c.b.pendingCount(t))
		})
		t.Run("StoreWithALease", func(t *testing.T) {
			db := backend.Open(t)
			table := testenv.Table(t)
			leased, err := sqlstore.New(sqlstore.Config{Dialect: backend.Dialect, Table: table, DB: db, Lease: time.Minute})
			require.NoError(t, err)
			require.NoError(t, leased.Migrate(context.Background()))
			t.Cleanup(func() { testenv.DropTable(t, db, backend.Dialect, table) })
			c := newFirstCopyCase(t, backend, outbox.Tracked{}, leased)
			c.deliver(t, "h", c.publish(t))
			assert.Equal(t, int64(1), c.store.checks.Load())
		})
	})
}
