package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// receiverDB is a receiving service's own database: its inbox and the
// table of its handler's effects.
type receiverDB struct {
	db      *sqlx.DB
	inbox   *sqlstore.Inbox
	effects string
}

func newReceiverDB(t *testing.T, b testenv.Backend) *receiverDB {
	t.Helper()
	return newReceiverDBWith(t, b, "uuid VARCHAR(64) NOT NULL")
}

// newReceiverDBWith is newReceiverDB whose effects table has columns.
func newReceiverDBWith(t *testing.T, b testenv.Backend, columns string) *receiverDB {
	t.Helper()
	ctx := testCtx(t)
	r := &receiverDB{db: b.Open(t), effects: "effects_" + testenv.Table(t)[2:]}
	var err error
	r.inbox, err = sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: r.db, Table: "inbox_" + testenv.Table(t)[2:]})
	require.NoError(t, err)
	require.NoError(t, r.inbox.Migrate(ctx))
	_, err = r.db.ExecContext(ctx, "CREATE TABLE "+r.effects+" ("+columns+")")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = r.db.ExecContext(context.Background(), "DROP TABLE "+r.effects)
		_, _ = r.db.ExecContext(context.Background(), "DROP TABLE "+r.inbox.Table())
	})
	return r
}

// effect writes the message's effect and its inbox entry in one
// transaction, and commits it or rolls it back; either way it returns nil,
// as a handler that forgets to report its rollback does.
func (r *receiverDB) effect(msg *message.Message, commit bool) error {
	ctx := msg.Context()
	tx, err := r.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	switch err := outbox.InboxTx(ctx, tx, msg); {
	case errors.Is(err, outbox.ErrAlreadyHandled):
		return nil
	case err != nil:
		return err
	}
	if _, err := tx.ExecContext(ctx, r.db.Rebind("INSERT INTO "+r.effects+" (uuid) VALUES (?)"), msg.UUID); err != nil {
		return err
	}
	if !commit {
		return tx.Rollback()
	}
	return tx.Commit()
}

func (r *receiverDB) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, r.db.Get(&n, "SELECT COUNT(*) FROM "+r.effects))
	return n
}

func (r *receiverDB) handled(t *testing.T, consumer, uuid string) bool {
	t.Helper()
	found, err := r.inbox.Handled(context.Background(), recordstore.InboxEntry{Consumer: consumer, MessageUUID: uuid})
	require.NoError(t, err)
	return found
}

// loggedError reports whether an error line of the logger wraps target.
func loggedError(l *testenv.CaptureLogger, target error) bool {
	for _, e := range l.Entries("error") {
		if errors.Is(e.Err, target) {
			return true
		}
	}
	return false
}

// TestInboxTxThatDidNotCommitIsNotConfirmed: service A, with a database of
// its own, publishes "orders" to remote consumer "billing" in service B,
// which has its own database and writes its effect with its inbox entry in
// one transaction (outbox.InboxTx), over one GoChannel. A handler that
// rolls that transaction back and returns nil has not had its effect: its
// delivery is neither confirmed nor recorded in the inbox, it is a failed
// attempt that A counts toward MaxAttempts, and A sends the message again.
// Every database, for both services.
func TestInboxTxThatDidNotCommitIsNotConfirmed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		t.Run("RetriedUntilItCommits", func(t *testing.T) {
			ctx := testCtx(t)
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			rdb := newReceiverDB(t, b)
			a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}},
				outbox.MiddlewareConfig{MaxAttempts: 5}, nil, quickConfirmations)
			r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Inbox: rdb.inbox, Confirmations: broker})
			var runs atomic.Int32
			r.handle("billing", "orders", broker, func(msg *message.Message) error {
				return rdb.effect(msg, runs.Add(1) > 2) // the first two roll back
			})
			a.start(t)
			r.start(t)
			require.NoError(t, a.pub.Publish("orders", message.NewMessage("order-1", []byte("{}"))))

			a.waitDrained(t, ctx, "orders")
			assert.Equal(t, int32(3), runs.Load(), "two handlings that rolled back, then one that committed")
			assert.Equal(t, 1, rdb.count(t), "one effect")
			assert.True(t, rdb.handled(t, "billing", "order-1"), "recorded in the inbox once it committed")
			assert.Equal(t, 2, a.obs.get("failed"), "A counted the two failed attempts")
			assert.Equal(t, 1, a.obs.get("handled"), "A completed the delivery once, on the confirmation")
			assert.True(t, loggedError(r.logger, outbox.ErrInboxTxNotCommitted), "B's log says why the handling failed")
			a.stop(t)
			r.stop(t)
		})

		t.Run("AbandonedAfterMaxAttempts", func(t *testing.T) {
			ctx := testCtx(t)
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			rdb := newReceiverDB(t, b)
			a := newPeerWith(t, b, "A", broker, []outbox.Tracked{{Topic: "orders", RemoteConsumers: []string{"billing"}}},
				outbox.MiddlewareConfig{MaxAttempts: 2}, nil, quickConfirmations)
			r := newPeer(t, b, "B", broker, nil, outbox.MiddlewareConfig{Inbox: rdb.inbox, Confirmations: broker})
			r.handle("billing", "orders", broker, func(msg *message.Message) error { return rdb.effect(msg, false) })
			a.start(t)
			r.start(t)
			require.NoError(t, a.pub.Publish("orders", message.NewMessage("order-1", []byte("{}"))))

			// The abandonment follows B's last run by a failure report:
			// no signal of B's tells when A has taken it.
			require.Eventually(t, func() bool { return a.obs.get("abandoned") > 0 }, 30*time.Second, 10*time.Millisecond,
				"A abandoned nothing; B ran %v", r.ran("billing"))
			recs, err := a.store.Operator().List(ctx, sqlstore.RecordFilter{State: recordstore.Abandoned}, 0, 10, 0)
			require.NoError(t, err)
			require.Len(t, recs, 1, "the record is kept, abandoned, for a requeue")
			require.Len(t, recs[0].Deliveries, 1)
			assert.Equal(t, 2, recs[0].Deliveries[0].Attempts)
			assert.True(t, strings.Contains(recs[0].Deliveries[0].LastError, "InboxTx"), "the last error says why: %q", recs[0].Deliveries[0].LastError)
			assert.Zero(t, rdb.count(t), "no effect")
			assert.False(t, rdb.handled(t, "billing", "order-1"), "never recorded as handled")
			assert.Zero(t, a.obs.get("handled"), "never confirmed")
			a.stop(t)
			r.stop(t)
		})
	})
}
