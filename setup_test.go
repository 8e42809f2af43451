package outbox_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func TestMain(m *testing.M) {
	// The project's own tests exercise the real path.
	os.Setenv(outbox.EnvToggle, "on")
	os.Exit(m.Run())
}

// bundle is what one test needs on one database.
type bundle struct {
	backend testenv.Backend
	db      *sqlx.DB
	store   *sqlstore.Store
	reg     *outbox.Registry
	topic   string
	logger  *testenv.CaptureLogger
}

// forEachBackend runs fn as a subtest on every database.
func forEachBackend(t *testing.T, fn func(t *testing.T, b testenv.Backend)) {
	testenv.ForEachBackend(t, fn)
}

func setup(t *testing.T, b testenv.Backend, mode sqlstore.Completion) *bundle {
	t.Helper()
	db := b.Open(t)
	store := testenv.NewStore(t, b, db, mode)
	topic := "orders_" + store.Table()
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store})
	require.NoError(t, err)
	return &bundle{backend: b, db: db, store: store, reg: reg, topic: topic, logger: &testenv.CaptureLogger{}}
}

func (b *bundle) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (b *bundle) pendingCount(t *testing.T) int {
	t.Helper()
	recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, 1_000_000)
	require.NoError(t, err)
	return len(recs)
}

func (b *bundle) rowCount(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.GetContext(b.ctx(t), &n, "SELECT COUNT(*) FROM "+b.store.Table()))
	return n
}

func (b *bundle) middleware(t *testing.T) message.HandlerMiddleware {
	t.Helper()
	reg := b.reg
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Backoff: redeliverAtOnce}, b.logger)
	require.NoError(t, err)
	return settledMiddleware(t, b.ctx(t), reg, mw)
}

// settledMiddleware is mw whose every call returns once the completion it
// started in the background is done: the tests call the handler as the
// router would and then read the record.
func settledMiddleware(t *testing.T, ctx context.Context, reg *outbox.Registry, mw message.HandlerMiddleware) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		handle := mw(h)
		return func(msg *message.Message) ([]*message.Message, error) {
			produced, err := handle(msg)
			if werr := outbox.WaitBackgroundCompletions(ctx, reg); werr != nil {
				t.Errorf("waiting for the completions: %v", werr)
			}
			return produced, err
		}
	}
}

// publishTracked publishes n tracked messages through the decorator into a
// GoChannel and returns them as the subscriber received them.
func (b *bundle) publishTracked(t *testing.T, n int) []*message.Message {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(n)}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	sub, err := gc.Subscribe(b.ctx(t), b.topic)
	require.NoError(t, err)
	pub, err := outbox.NewPublisher(b.reg, gc)
	require.NoError(t, err)
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("payload"))
	}
	require.NoError(t, pub.Publish(b.topic, msgs...))
	got := make([]*message.Message, 0, n)
	for len(got) < n {
		select {
		case m := <-sub:
			// GoChannel cancels a message's context once it is acked; the
			// tests hand a fresh copy to the middleware, as a redelivery.
			got = append(got, m.Copy())
			m.Ack()
		case <-b.ctx(t).Done():
			t.Fatalf("received %d of %d messages", len(got), n)
		}
	}
	return got
}

// countingPublisher counts the Publish calls that reach the real publisher
// it wraps.
type countingPublisher struct {
	message.Publisher
	mu    sync.Mutex
	calls int
	msgs  int
}

func (c *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	c.mu.Lock()
	c.calls++
	c.msgs += len(msgs)
	c.mu.Unlock()
	return c.Publisher.Publish(topic, msgs...)
}

// Unwrap lets the replay see the publisher underneath, a GoChannel in most
// tests.
func (c *countingPublisher) Unwrap() message.Publisher { return c.Publisher }

func (c *countingPublisher) counts() (calls, msgs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls, c.msgs
}

// closedDB returns a handle of the backend's kind that has been closed: every
// query on it fails the way a vanished database does.
func closedDB(t *testing.T, b testenv.Backend) *sqlx.DB {
	t.Helper()
	db := b.Open(t)
	require.NoError(t, db.Close())
	return db
}

// delivery names the record id on the bundle's topic, as the middleware
// does for a message received outside a router.
func (b *bundle) delivery(id int64) recordstore.Delivery {
	return recordstore.Delivery{ID: id, Topic: b.topic}
}

// ownMetadata stamps outbox metadata naming record id (as text) of the
// bundle's topic and table, as the publisher would.
func (b *bundle) ownMetadata(t *testing.T, msg *message.Message, id string) *message.Message {
	t.Helper()
	identity, err := b.store.Identity(b.ctx(t))
	require.NoError(t, err)
	msg.Metadata.Set(outbox.MetadataID, id)
	msg.Metadata.Set(outbox.MetadataTopic, b.topic)
	msg.Metadata.Set(outbox.MetadataTable, identity)
	return msg
}

// redeliverAtOnce turns the retry backoff off, for tests whose subject is
// what happens on an immediate redelivery; the backoff has tests of its own.
var redeliverAtOnce = outbox.Backoff{Disabled: true}
