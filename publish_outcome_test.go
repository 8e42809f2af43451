package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// networkBackends are the databases reached over a connection, whose
// answer can be lost: PostgreSQL and MariaDB.
func networkBackends(t *testing.T, fn func(t *testing.T, b testenv.Backend)) {
	for _, b := range testenv.Backends() {
		if b.Name == "SQLite" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) { fn(t, b) })
	}
}

// TestPublishOutcome: a caller whose context ends while its insert is on
// its way is never left not knowing whether the records were saved, and an
// insert that gets no answer says that its outcome is unknown rather than
// that nothing was saved. Topology: one publisher, one table, PostgreSQL
// and MariaDB.
func TestPublishOutcome(t *testing.T) {
	networkBackends(t, func(t *testing.T, backend testenv.Backend) {
		t.Run("CancelWhileTheInsertIsInFlightFinishesTheInsert", func(t *testing.T) {
			// The answer comes within the grace after the cancel: the
			// outcome is known.
			defer outbox.SetInsertGrace(time.Minute)()
			b := setup(t, backend, sqlstore.Mark)
			raw := &countingPublisher{Publisher: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
			defer raw.Close()
			pub, err := outbox.NewPublisher(b.reg, raw)
			require.NoError(t, err)
			require.NoError(t, pub.Publish(b.topic, message.NewMessage("warm-up", nil)), "reads the table's identity")

			unlock := lockTable(t, b)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs := make([]*message.Message, 5)
			for i := range msgs {
				msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("x"))
				msgs[i].SetContext(ctx)
			}
			done := make(chan error, 1)
			go func() { done <- pub.Publish(b.topic, msgs...) }()
			awaitInsertWaiting(t, b)
			cancel()
			unlock()

			err = <-done
			var sendErr *outbox.SendError
			require.ErrorAs(t, err, &sendErr, "the records were saved: the caller must not publish them again")
			assert.ErrorIs(t, err, context.Canceled)
			assert.Len(t, sendErr.IDs, 5)
			assert.Equal(t, 1+5, b.pendingCount(t), "the five are pending for replay")
			_, sent := raw.counts()
			assert.Equal(t, 1, sent, "only the warm-up was sent")
		})

		t.Run("NoAnswerIsAnUnknownOutcome", func(t *testing.T) {
			defer outbox.SetInsertTimeout(500 * time.Millisecond)()
			b := setup(t, backend, sqlstore.Mark)
			_, viaProxy, proxy := proxied(t, backend)
			b.store.Attach(viaProxy)
			raw := &countingPublisher{Publisher: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
			defer raw.Close()
			pub, err := outbox.NewPublisher(b.reg, raw)
			require.NoError(t, err)
			require.NoError(t, pub.Publish(b.topic, message.NewMessage("warm-up", nil)))

			proxy.Silence()
			defer proxy.Restore()
			err = pub.Publish(b.topic, message.NewMessage("unanswered", nil))
			var insErr *outbox.InsertError
			require.ErrorAs(t, err, &insErr)
			assert.True(t, insErr.OutcomeUnknown)
			assert.ErrorIs(t, err, outbox.ErrOutcomeUnknown)
			assert.Contains(t, err.Error(), "may have been saved")
			_, sent := raw.counts()
			assert.Equal(t, 1, sent, "nothing was sent")
		})

		t.Run("DeadlineBoundsThePublishWhenTheDatabaseIsSilent", func(t *testing.T) {
			// The insert's own bound is far away: only the caller's
			// deadline can end the publish while the database is silent.
			defer outbox.SetInsertTimeout(10 * time.Minute)()
			b := setup(t, backend, sqlstore.Mark)
			_, viaProxy, proxy := proxied(t, backend)
			b.store.Attach(viaProxy)
			raw := &countingPublisher{Publisher: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
			defer raw.Close()
			pub, err := outbox.NewPublisher(b.reg, raw)
			require.NoError(t, err)
			require.NoError(t, pub.Publish(b.topic, message.NewMessage("warm-up", nil)))

			proxy.Silence()
			defer proxy.Restore()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			msg := message.NewMessage("unanswered", nil)
			msg.SetContext(ctx)
			err = pub.Publish(b.topic, msg)
			var insErr *outbox.InsertError
			require.ErrorAs(t, err, &insErr)
			assert.True(t, insErr.OutcomeUnknown)
			assert.ErrorIs(t, err, outbox.ErrOutcomeUnknown)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Contains(t, err.Error(), "may have been saved")
			// The database has not answered yet: the insert is still on
			// its way in the background.
			expired, cancelExpired := context.WithCancel(context.Background())
			cancelExpired()
			assert.ErrorIs(t, b.reg.WaitCompletions(expired), context.Canceled, "the insert still runs")
			_, sent := raw.counts()
			assert.Equal(t, 1, sent, "nothing was sent")

			proxy.Restore()
			waitCtx, cancelWait := context.WithTimeout(context.Background(), time.Minute)
			defer cancelWait()
			require.NoError(t, b.reg.WaitCompletions(waitCtx))
			assert.Equal(t, 2, b.pendingCount(t), "the insert finished after the publish returned: its record is pending for a resend")
		})

		t.Run("RefusedInsertSavedNothing", func(t *testing.T) {
			b := setup(t, backend, sqlstore.Mark)
			_, err := b.db.Exec("DROP TABLE " + b.store.Table())
			require.NoError(t, err)
			pub, err := outbox.NewPublisher(b.reg, gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}))
			require.NoError(t, err)
			err = pub.Publish(b.topic, message.NewMessage("refused", nil))
			var insErr *outbox.InsertError
			require.ErrorAs(t, err, &insErr)
			assert.False(t, insErr.OutcomeUnknown, "the database answered: nothing was saved")
			assert.NotErrorIs(t, err, outbox.ErrOutcomeUnknown)
			assert.Contains(t, err.Error(), "nothing was saved")
		})
	})
}

// lockTable takes a lock on the bundle's table, on a connection of its own,
// that makes inserts wait until the returned function releases it.
func lockTable(t *testing.T, b *bundle) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.db.Connx(ctx)
	require.NoError(t, err)
	lock, release := "LOCK TABLES "+b.store.Table()+" READ", "UNLOCK TABLES"
	if b.backend.Name == "Postgres" {
		_, err = conn.ExecContext(ctx, "BEGIN")
		require.NoError(t, err)
		lock, release = "LOCK TABLE "+b.store.Table()+" IN SHARE MODE", "COMMIT"
	}
	_, err = conn.ExecContext(ctx, lock)
	require.NoError(t, err)
	var once bool
	unlock = func() {
		if once {
			return
		}
		once = true
		_, err := conn.ExecContext(ctx, release)
		assert.NoError(t, err)
		assert.NoError(t, conn.Close())
	}
	t.Cleanup(unlock)
	return unlock
}

// awaitInsertWaiting waits until the database shows an insert into the
// bundle's table waiting for a lock: the statement has arrived.
func awaitInsertWaiting(t *testing.T, b *bundle) {
	t.Helper()
	q := "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE CONCAT('INSERT INTO%', ?, '%') AND STATE LIKE '%lock%'"
	if b.backend.Name == "Postgres" {
		q = "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%' || $1 || '%'"
	}
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.db.Get(&n, q, b.store.Table()))
		return n > 0
	}, 30*time.Second, 5*time.Millisecond, "the insert never reached the database")
}
