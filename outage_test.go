package outbox_test

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/faultproxy"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestDatabaseOutage cuts the TCP connection between the service and
// PostgreSQL with a real proxy: publishes fail and send nothing, checks nack
// without running handlers, marks fail and are logged; after the database is
// back, a replay delivers everything that was recorded.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	direct := testenv.Postgres(t)
	backend := testenv.Backends()[0]
	require.Equal(t, "Postgres", backend.Name)

	u, err := url.Parse(testenv.PostgresDSN())
	require.NoError(t, err)
	proxy, err := faultproxy.New(u.Host)
	require.NoError(t, err)
	defer proxy.Close()
	u.Host = proxy.Addr()
	viaProxy, err := sqlx.Open("pgx", u.String())
	require.NoError(t, err)
	defer viaProxy.Close()

	store := testenv.NewStore(t, backend, direct, sqlstore.Mark)
	store.Attach(viaProxy)
	b := &bundle{backend: backend, db: direct, store: store, topic: "orders_" + store.Table(), logger: &testenv.CaptureLogger{}}
	b.reg, err = outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store})
	require.NoError(t, err)

	msgs := b.publishTracked(t, 2)
	markFails, fetchFails := msgs[0], msgs[1]
	mw := b.middleware(t)

	// The database goes away while a handler runs: its mark fails.
	ran := 0
	_, err = mw(func(*message.Message) ([]*message.Message, error) {
		ran++
		proxy.Cut()
		return nil, nil
	})(markFails)
	require.NoError(t, err, "the handler's success stands")
	require.Equal(t, 1, ran)
	require.Len(t, b.logger.Entries("error"), 1, "the failed mark is logged")

	// While it is away, a tracked publish fails and sends nothing.
	raw := &countingPublisher{Publisher: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
	defer raw.Close()
	pub, err := outbox.NewPublisher(b.reg, raw)
	require.NoError(t, err)
	var insErr *outbox.InsertError
	require.ErrorAs(t, pub.Publish(b.topic, message.NewMessage("during-outage", nil)), &insErr)
	calls, _ := raw.counts()
	assert.Zero(t, calls)

	// A delivery cannot check its record: nack, handler not run.
	_, err = mw(func(*message.Message) ([]*message.Message, error) {
		ran++
		return nil, nil
	})(fetchFails)
	var fetchErr *outbox.CheckError
	require.ErrorAs(t, err, &fetchErr)
	assert.Equal(t, 1, ran, "no handler runs while the record cannot be read")

	// The database is back: a restart replays both pending records.
	proxy.Restore()
	require.Equal(t, 2, b.pendingCount(t), "nothing was lost: both records are pending")
	handled := newHandledSet(2)
	router, _ := restartedService(t, b, handled, nil, outbox.ReplayConfig{})
	runUntilHandled(t, b, router, handled)
	assert.Equal(t, map[string]int{markFails.UUID: 1, fetchFails.UUID: 1}, handled.snapshot())
	assert.Zero(t, b.pendingCount(t))
	assert.Zero(t, b.rowCount(t)-2, "the publish that failed left no record")
}

// TestReplayDatabaseFailsHalfway loses the database after the first page of a
// replay: startup aborts with an error naming where it stopped, and nothing
// is lost.
func TestReplayDatabaseFailsHalfway(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		crashBeforeConsumption(t, b, 20)
		recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, 100)
		require.NoError(t, err)
		live := b.store.DB()

		gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		defer gc.Close()
		failAfterFirst := &hookPublisher{Publisher: gc, after: func() { b.store.Attach(closedDB(t, backend)) }}
		_, err = outbox.Replay(b.ctx(t), b.reg, failAfterFirst, outbox.ReplayConfig{PageSize: 2, Mode: outbox.ReplayAll}, nil)
		var replayErr *outbox.ResendError
		require.ErrorAs(t, err, &replayErr)
		// The reader reads ahead by at most two pages of two.
		assert.Zero(t, replayErr.ID, "a read failure, not a send failure")
		assert.Contains(t, []int64{recs[1].ID, recs[3].ID, recs[5].ID}, replayErr.AfterID)
		assert.Contains(t, err.Error(), b.topic)
		assert.Contains(t, err.Error(), fmt.Sprintf("after record %d", replayErr.AfterID))

		b.store.Attach(live)
		assert.Equal(t, 20, b.pendingCount(t))
	})
}

// hookPublisher calls after once, after the first Publish went through.
type hookPublisher struct {
	message.Publisher
	after func()
	done  bool
}

func (h *hookPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := h.Publisher.Publish(topic, msgs...)
	if !h.done {
		h.done = true
		h.after()
	}
	return err
}
