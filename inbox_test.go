package outbox_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"sync"
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
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// effectsMessages is how many messages the exactly-once test sends. Under
// the race detector 10,000 take minutes of both cores on SQLite and
// PostgreSQL, beside the rest of CI.
var effectsMessages = flag.Int("effects.messages", 2_000,
	"messages sent by TestExactlyOnceEffectInTheReceiversDatabase (full size: -effects.messages=10000)")

// TestExactlyOnceEffectInTheReceiversDatabase: service A (a database of its
// own) publishes tracked messages (-effects.messages) to service B, which
// has a database of its own and runs as two instances, each receiving every message (two
// concurrent copies of each). B's handler writes its effect and the inbox
// entry in one transaction (outbox.InboxTx), and one handling in 20 fails
// after its commit, so that its copy comes back. B's database ends with
// exactly one effect per message.
func TestExactlyOnceEffectInTheReceiversDatabase(t *testing.T) {
	t.Parallel()
	messages := *effectsMessages
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		// A bound on a hang, not on speed: under the race detector, beside
		// the other packages' tests, SQLite's 20,000 handlings of the full
		// size took more than five minutes once.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		storeA := testenv.NewStore(t, b, b.Open(t), sqlstore.Mark)
		regA, err := outbox.NewRegistry(outbox.Tracked{Topic: "effects", Store: storeA, CompletedBy: outbox.OnSend})
		require.NoError(t, err)

		dbB := b.Open(t)
		if b.Name == "SQLite" {
			// B's file waits for no disk flush per commit (WAL with
			// synchronous NORMAL, durable across a crash of the process):
			// thousands of handlings then take seconds, not minutes.
			_, err := dbB.ExecContext(ctx, "PRAGMA synchronous = NORMAL")
			require.NoError(t, err)
		}
		inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: dbB, Table: "inbox_" + testenv.Table(t)[2:]})
		require.NoError(t, err)
		require.NoError(t, inbox.Migrate(ctx))
		effects := "effects_" + testenv.Table(t)[2:]
		_, err = dbB.ExecContext(ctx, "CREATE TABLE "+effects+" (uuid VARCHAR(64) NOT NULL)")
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = dbB.ExecContext(context.Background(), "DROP TABLE "+effects)
			_, _ = dbB.ExecContext(context.Background(), "DROP TABLE "+inbox.Table())
		})

		broker := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(messages)}, watermill.NopLogger{})
		t.Cleanup(func() { _ = broker.Close() })
		var acked atomic.Int64
		done := make(chan struct{})
		var closeDone sync.Once
		const copies = 2 // one per instance
		countAcks := func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				if err == nil && acked.Add(1) == int64(copies*messages) {
					closeDone.Do(func() { close(done) })
				}
				return out, err
			}
		}
		var failures atomic.Int64
		handle := func(msg *message.Message) error {
			return effectOnce(msg, dbB, effects, &failures)
		}
		for range copies {
			regB, err := outbox.NewRegistry() // B tracks nothing of its own
			require.NoError(t, err)
			mw, err := outbox.NewMiddleware(regB, outbox.MiddlewareConfig{Inbox: inbox}, nil)
			require.NoError(t, err)
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			router.AddMiddleware(countAcks, mw)
			router.AddNoPublisherHandler("effects", "effects", broker, handle)
			runErr := make(chan error, 1)
			go func() { runErr <- router.Run(context.Background()) }()
			select {
			case <-router.Running():
			case err := <-runErr:
				t.Fatalf("the router stopped before it ran: %v", err)
			}
			t.Cleanup(func() {
				require.NoError(t, router.Close())
				require.NoError(t, <-runErr)
			})
		}

		pub, err := outbox.NewPublisher(regA, broker)
		require.NoError(t, err)
		batch := make([]*message.Message, 0, 500)
		for i := range messages {
			batch = append(batch, message.NewMessage(fmt.Sprintf("effect-%05d", i), []byte("{}")))
			if len(batch) == cap(batch) || i == messages-1 {
				require.NoError(t, pub.Publish("effects", batch...))
				batch = batch[:0]
			}
		}
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatalf("%d of %d copies acked", acked.Load(), copies*messages)
		}

		var n, distinct int
		require.NoError(t, dbB.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+effects))
		require.NoError(t, dbB.GetContext(ctx, &distinct, "SELECT COUNT(DISTINCT uuid) FROM "+effects))
		assert.Equal(t, messages, n, "effects")
		assert.Equal(t, messages, distinct, "distinct effects")
		assert.Positive(t, failures.Load(), "handlings that failed after their commit")
		t.Logf("%s: %d effects of %d messages, %d copies acked, %d handlings failed after their commit", b.Name, n, messages, acked.Load(), failures.Load())
	})
}

// effectOnce writes the message's effect and its inbox entry in one
// transaction; one handling in 20 fails after the commit.
func effectOnce(msg *message.Message, db *sqlx.DB, effects string, failures *atomic.Int64) error {
	ctx := msg.Context()
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	switch err := outbox.InboxTx(ctx, tx, msg); {
	case errors.Is(err, outbox.ErrAlreadyHandled):
		return nil // another copy did it
	case err != nil:
		return err
	}
	if _, err := tx.ExecContext(ctx, db.Rebind("INSERT INTO "+effects+" (uuid) VALUES (?)"), msg.UUID); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(msg.UUID))
	if h.Sum32()%20 == 0 {
		failures.Add(1)
		return errors.New("failed after the commit")
	}
	return nil
}

// TestCleanerCleansInboxes: a receiving service's cleaner deletes its inbox
// entries older than InboxOlderThan, and keeps the younger ones, whose
// copies are still skipped.
func TestCleanerCleansInboxes(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		db := b.Open(t)
		inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db, Table: "inbox_" + testenv.Table(t)[2:]})
		require.NoError(t, err)
		require.NoError(t, inbox.Migrate(ctx))
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE "+inbox.Table()) })
		for i := range 5 {
			require.NoError(t, inbox.MarkHandled(ctx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: fmt.Sprintf("old-%d", i)}))
		}
		require.NoError(t, inbox.MarkHandled(ctx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: "young"}))
		_, err = db.ExecContext(ctx, db.Rebind("UPDATE "+inbox.Table()+" SET handled_at = ? WHERE message_uuid <> ?"), "2000-01-01 00:00:00", "young")
		require.NoError(t, err)

		empty, err := outbox.NewRegistry()
		require.NoError(t, err)
		cleaner, err := outboxops.NewCleaner(empty, outboxops.CleanerConfig{Inboxes: []recordstore.Inbox{inbox}, InboxOlderThan: 24 * time.Hour, BatchSize: 2}, nil)
		require.NoError(t, err)
		n, err := cleaner.CleanOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 5, n, "the old entries, in batches of 2")
		for i := range 5 {
			handled, err := inbox.Handled(ctx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: fmt.Sprintf("old-%d", i)})
			require.NoError(t, err)
			assert.False(t, handled)
		}
		handled, err := inbox.Handled(ctx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: "young"})
		require.NoError(t, err)
		assert.True(t, handled, "a young entry is kept")

		_, err = outboxops.NewCleaner(empty, outboxops.CleanerConfig{Inboxes: []recordstore.Inbox{nil}}, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
	})
}
