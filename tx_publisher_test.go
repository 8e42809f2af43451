package outbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// effectsTable creates the business table of a test: one row per business
// effect, with no unique key, so that a duplicate effect shows as a row.
func effectsTable(t *testing.T, b *bundle) string {
	t.Helper()
	name := b.store.Table() + "_fx"
	_, err := b.db.ExecContext(b.ctx(t), "CREATE TABLE "+name+" (record_id BIGINT NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name) })
	return name
}

func countRows(t *testing.T, db *sqlx.DB, query string) int {
	t.Helper()
	var n int
	require.NoError(t, db.GetContext(context.Background(), &n, query))
	return n
}

// txPublisher returns a transactional publisher into a GoChannel, counting
// what reaches it, and a subscription to the tracked topic.
func (b *bundle) txPublisher(t *testing.T) (*outbox.TxPublisher, *countingPublisher, <-chan *message.Message) {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	sub, err := gc.Subscribe(b.ctx(t), b.topic)
	require.NoError(t, err)
	counting := &countingPublisher{Publisher: gc}
	p, err := outbox.NewTxPublisher(b.reg, counting)
	require.NoError(t, err)
	return p, counting, sub
}

func TestTxPublisher(t *testing.T) {
	t.Parallel()

	t.Run("RollbackSendsNothingAndLeavesNoRecord", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			fx := effectsTable(t, b)
			p, sent, _ := b.txPublisher(t)

			tx, err := b.db.BeginTxx(b.ctx(t), nil)
			require.NoError(t, err)
			ptx := p.Wrap(tx)
			_, err = ptx.ExecContext(b.ctx(t), "INSERT INTO "+fx+" (record_id) VALUES (1)")
			require.NoError(t, err)
			require.NoError(t, ptx.Publish(b.ctx(t), b.topic, message.NewMessage("a", nil), message.NewMessage("b", nil)))
			require.NoError(t, ptx.Rollback())

			assert.Zero(t, sent.calls, "nothing is sent")
			assert.Zero(t, b.rowCount(t), "no record is left")
			assert.Zero(t, countRows(t, b.db, "SELECT COUNT(*) FROM "+fx), "the business row rolled back with it")
			assert.ErrorIs(t, ptx.Commit(), outbox.ErrTxDone)
			assert.Zero(t, sent.calls)
		})
	})

	t.Run("CommitSendsAfterTheCommitAndTheReceiverCompletes", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			fx := effectsTable(t, b)
			p, sent, sub := b.txPublisher(t)

			tx, err := b.db.BeginTxx(b.ctx(t), nil)
			require.NoError(t, err)
			ptx := p.Wrap(tx)
			defer ptx.Rollback() //nolint:errcheck // no-op after Commit
			_, err = ptx.ExecContext(b.ctx(t), "INSERT INTO "+fx+" (record_id) VALUES (1)")
			require.NoError(t, err)
			msgs := []*message.Message{message.NewMessage("a", []byte("1")), message.NewMessage("b", []byte("2"))}
			require.NoError(t, ptx.Publish(b.ctx(t), b.topic, msgs...))
			require.NoError(t, ptx.Publish(b.ctx(t), b.topic, message.NewMessage("c", nil)))
			assert.Zero(t, sent.calls, "nothing is sent before the commit")
			require.NoError(t, ptx.Commit())
			assert.Equal(t, 2, sent.calls, "each Publish is one send, after the commit")
			assert.Equal(t, 3, sent.msgs)
			assert.Equal(t, 3, b.pendingCount(t), "the records committed with the business row")
			assert.Equal(t, 1, countRows(t, b.db, "SELECT COUNT(*) FROM "+fx))

			h := &recordingHandler{}
			for range 3 {
				msg := <-sub
				_, err := b.middleware(t)(h.handle)(msg.Copy())
				require.NoError(t, err)
				msg.Ack()
			}
			assert.EqualValues(t, 3, h.runs.Load())
			assert.Zero(t, b.pendingCount(t), "the receiver completed every record")
		})
	})

	t.Run("PublishTxReturnsTheSendForAfterCommit", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			p, sent, sub := b.txPublisher(t)
			tx, err := b.db.BeginTx(b.ctx(t), nil) // a plain *sql.Tx
			require.NoError(t, err)
			msg := message.NewMessage("a", nil)
			send, err := p.PublishTx(b.ctx(t), tx, b.topic, msg)
			require.NoError(t, err)
			assert.NotEmpty(t, msg.Metadata.Get(outbox.MetadataID), "the record id is stamped at once")
			require.NoError(t, tx.Commit())
			assert.Zero(t, sent.calls)
			require.NoError(t, send())
			got := <-sub
			got.Ack()
			assert.Equal(t, msg.Metadata.Get(outbox.MetadataID), got.Metadata.Get(outbox.MetadataID))
			assert.Equal(t, 1, b.pendingCount(t))
		})
	})

	t.Run("FailedCommitSendsNothing", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			p, sent, _ := b.txPublisher(t)
			tx, err := b.db.BeginTxx(b.ctx(t), nil)
			require.NoError(t, err)
			ptx := p.Wrap(tx)
			require.NoError(t, ptx.Publish(b.ctx(t), b.topic, message.NewMessage("a", nil)))
			require.NoError(t, tx.Rollback()) // ended behind the wrapper's back
			require.ErrorIs(t, ptx.Commit(), sql.ErrTxDone)
			assert.Zero(t, sent.calls)
			assert.Zero(t, b.rowCount(t))
		})
	})

	t.Run("UntrackedTopicIsSentAfterCommitWithoutRecord", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Backends()[0], sqlstore.Mark)
		p, sent, _ := b.txPublisher(t)
		tx, err := b.db.BeginTxx(b.ctx(t), nil)
		require.NoError(t, err)
		ptx := p.Wrap(tx)
		msg := message.NewMessage("a", nil)
		require.NoError(t, ptx.Publish(b.ctx(t), "untracked", msg))
		assert.Zero(t, sent.calls)
		require.NoError(t, ptx.Commit())
		assert.Equal(t, 1, sent.calls)
		assert.Empty(t, msg.Metadata.Get(outbox.MetadataID))
		assert.Zero(t, b.rowCount(t))
	})

	t.Run("StoreWithoutInsertTxIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Backends()[0], sqlstore.Mark)
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: plainStore{b.store}})
		require.NoError(t, err)
		p, err := outbox.NewTxPublisher(reg, gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}))
		require.NoError(t, err)
		tx, err := b.db.BeginTxx(b.ctx(t), nil)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck // nothing to keep
		_, err = p.PublishTx(b.ctx(t), tx, b.topic, message.NewMessage("a", nil))
		var insertErr *outbox.InsertError
		require.ErrorAs(t, err, &insertErr)
		assert.ErrorIs(t, err, outbox.ErrNotSupported)
	})
}
