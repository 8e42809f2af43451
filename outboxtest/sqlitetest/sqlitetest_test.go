package sqlitetest_test

import (
	"database/sql"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxtest"
	"github.com/wmoutbox/outbox/outboxtest/sqlitetest"
	"github.com/wmoutbox/outbox/recordstore"
)

// sender is the service that publishes "orders", as its own tests build it.
type sender struct {
	store *outboxtest.Store
	reg   *outbox.Registry
	pub   *outboxtest.Publisher
}

func newSender(t *testing.T, tracked outbox.Tracked) sender {
	t.Helper()
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	tracked.Topic, tracked.Store = "orders", store
	reg := outboxtest.NewRegistry(t, tracked)
	return sender{store: store, reg: reg, pub: outboxtest.NewPublisher(t, reg)}
}

// order publishes an order and returns the message as the broker delivers
// it.
func (s sender) order(t *testing.T, payload string) *message.Message {
	t.Helper()
	require.NoError(t, s.pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(payload))))
	sent := s.pub.Sent("orders")
	return sent[len(sent)-1]
}

// countInvoices is the receiver's effects: rows of its business table.
func countInvoices(t *testing.T, db *sqlitetest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, "SELECT COUNT(*) FROM invoices"))
	return n
}

// inTx is a handler of the billing service that records the message with
// InboxTx and writes the invoice in one transaction, then returns finish's
// error: commit commits; a finish that does not leaves the transaction to
// roll back. InboxTx's error, ErrAlreadyHandled included, is returned as
// it is.
func inTx(db *sqlitetest.DB, finish func(tx *sql.Tx) error) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
		if err := outbox.InboxTx(ctx, tx, msg); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_uuid, payload) VALUES (?, ?)", msg.UUID, string(msg.Payload)); err != nil {
			return err
		}
		return finish(tx)
	}
}

func commit(tx *sql.Tx) error { return tx.Commit() }

// A handler whose business write fails rolls its transaction back and
// returns the error: neither the inbox entry nor the invoice is saved, the
// copy is nacked, and the copy the broker sends again is handled.
func TestRolledBackInboxTxIsNotHandled(t *testing.T) {
	t.Parallel()
	a := newSender(t, outbox.Tracked{})
	msg := a.order(t, "order-1")
	db := sqlitetest.Open(t, invoices)
	receiver := outboxtest.NewRegistry(t)
	cfg := outbox.MiddlewareConfig{Inbox: db.Inbox}

	down := errors.New("payment service down")
	failed := outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", inTx(db, func(*sql.Tx) error { return down }), msg)
	assert.False(t, failed.Acked, "nacked, for the broker to send it again")
	assert.Equal(t, 1, failed.Runs)
	assert.ErrorIs(t, failed.Err, down)
	assert.Empty(t, db.Handled(t, "billing"), "no inbox entry")
	assert.Zero(t, countInvoices(t, db), "no invoice")

	again := outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", inTx(db, commit), msg)
	assert.Equal(t, outboxtest.Outcome{Acked: true, Tracked: true, Runs: 1}, again, "the copy sent again is handled")
	assert.Equal(t, []string{msg.UUID}, db.Handled(t, "billing"))
	assert.Equal(t, 1, countInvoices(t, db))
}

// A handler that rolls its InboxTx transaction back but returns nil has not
// had its effect: when the message asks for no confirmation, the
// middleware finds no inbox entry and nacks the copy with
// outbox.ErrInboxTxNotCommitted, and records nothing itself.
func TestRolledBackInboxTxIsNackedWithoutConfirmations(t *testing.T) {
	t.Parallel()
	a := newSender(t, outbox.Tracked{})
	msg := a.order(t, "order-1")
	db := sqlitetest.Open(t, invoices)
	receiver := outboxtest.NewRegistry(t)
	cfg := outbox.MiddlewareConfig{Inbox: db.Inbox}

	forgot := inTx(db, func(tx *sql.Tx) error { return tx.Rollback() })
	got := outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", forgot, msg)
	assert.False(t, got.Acked, "nacked")
	assert.ErrorIs(t, got.Err, outbox.ErrInboxTxNotCommitted)
	assert.Empty(t, db.Handled(t, "billing"), "the middleware did not record it either")
	assert.Zero(t, countInvoices(t, db))

	again := outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", inTx(db, commit), msg)
	assert.True(t, again.Acked)
	assert.Equal(t, []string{msg.UUID}, db.Handled(t, "billing"))
	assert.Equal(t, 1, countInvoices(t, db))
}

// When the message asks for a confirmation (the sender declares billing a
// remote consumer), the same handling is acknowledged and reported to the
// sender as a failure: the report that the kit's publisher kept, handed to
// the sender's confirmation handler, counts a failed attempt; after the
// handling that commits, the confirmation completes the delivery.
func TestRolledBackInboxTxIsReportedToTheSender(t *testing.T) {
	t.Parallel()
	a := newSender(t, outbox.Tracked{RemoteConsumers: []string{"billing"}})
	msg := a.order(t, "order-1")
	id := outboxtest.RequirePending(t, a.store, "orders", 1)[0].ID
	confirm, err := outbox.NewConfirmationHandler(a.reg, outbox.ConfirmationHandlerConfig{}, nil)
	require.NoError(t, err)

	db := sqlitetest.Open(t, invoices)
	receiver := outboxtest.NewRegistry(t)
	confirmations := outboxtest.NewPublisher(t, receiver)
	cfg := outbox.MiddlewareConfig{Inbox: db.Inbox, Confirmations: confirmations}

	forgot := inTx(db, func(tx *sql.Tx) error { return tx.Rollback() })
	got := outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", forgot, msg)
	assert.True(t, got.Acked, "acknowledged: the sender sends it again")
	assert.Empty(t, db.Handled(t, "billing"))
	assert.Zero(t, countInvoices(t, db))
	reports := confirmations.Sent(outbox.DefaultConfirmTopic)
	require.Len(t, reports, 1)
	require.NoError(t, confirm(reports[0]))
	info, found := a.store.Record(id)
	require.True(t, found)
	require.Len(t, info.Deliveries, 1)
	assert.Equal(t, 1, info.Deliveries[0].Attempts, "the sender counted the failed attempt")
	assert.Contains(t, info.Deliveries[0].LastError, "InboxTx")

	again := outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", inTx(db, commit), msg)
	assert.True(t, again.Acked)
	assert.Equal(t, 1, countInvoices(t, db))
	reports = confirmations.Sent(outbox.DefaultConfirmTopic)
	require.Len(t, reports, 2)
	require.NoError(t, confirm(reports[1]))
	outboxtest.RequireCompleted(t, a.store, id)
}

// Two copies of one message handled at the same moment (two instances of
// the receiver, say) both find no inbox entry and both run the handler;
// the second transaction waits for the first and its InboxTx gets
// ErrAlreadyHandled. One invoice, one entry, both copies acknowledged.
func TestCopiesAtTheSameMomentHaveOneEffect(t *testing.T) {
	t.Parallel()
	a := newSender(t, outbox.Tracked{})
	msg := a.order(t, "order-1")
	db := sqlitetest.Open(t, invoices)
	receiver := outboxtest.NewRegistry(t)
	cfg := outbox.MiddlewareConfig{Inbox: db.Inbox}

	// Neither copy begins its transaction before both have passed the
	// middleware's inbox check and entered the handler.
	const copies = 2
	var arrived, duplicates atomic.Int32
	together := make(chan struct{})
	handle := func(m *message.Message) error {
		if arrived.Add(1) == copies {
			close(together)
		}
		select {
		case <-together:
		case <-m.Context().Done():
			return m.Context().Err()
		}
		err := inTx(db, commit)(m)
		if errors.Is(err, outbox.ErrAlreadyHandled) {
			duplicates.Add(1)
			return nil // the other copy did it
		}
		return err
	}
	var wg sync.WaitGroup
	outcomes := make([]outboxtest.Outcome, copies)
	for i := range copies {
		wg.Go(func() { outcomes[i] = outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", handle, msg) })
	}
	wg.Wait()
	for i, got := range outcomes {
		assert.Equal(t, outboxtest.Outcome{Acked: true, Tracked: true, Runs: 1}, got, "copy %d", i)
	}
	assert.Equal(t, int32(1), duplicates.Load(), "one copy's InboxTx waited for the other's transaction and found its entry")
	assert.Equal(t, 1, countInvoices(t, db), "one invoice")
	assert.Equal(t, []string{msg.UUID}, db.Handled(t, "billing"))
}

// Open executes the schema statements in order, several in one string
// too; Handled lists a consumer's committed entries in the order they
// were saved.
func TestOpenAndHandled(t *testing.T) {
	t.Parallel()
	db := sqlitetest.Open(t, invoices, "CREATE TABLE shipments (id TEXT); CREATE INDEX shipments_id ON shipments (id)")
	ctx := t.Context()
	_, err := db.ExecContext(ctx, "INSERT INTO shipments (id) VALUES ('s1')")
	require.NoError(t, err, "the second schema string's table")
	assert.Zero(t, countInvoices(t, db), "the first schema string's table")

	for _, e := range []recordstore.InboxEntry{
		{Consumer: "billing", MessageUUID: "m2"},
		{Consumer: "shipping", MessageUUID: "m1"},
		{Consumer: "billing", MessageUUID: "m1"},
	} {
		require.NoError(t, db.Inbox.MarkHandled(ctx, e))
	}
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, db.Inbox.MarkHandledTx(ctx, tx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m3"}))
	assert.Equal(t, []string{"m2", "m1"}, db.Handled(t, "billing"), "an entry whose transaction is open is not handled yet")
	assert.Equal(t, []string{"m1"}, db.Handled(t, "shipping"))
	require.NoError(t, tx.Commit())
	assert.Equal(t, []string{"m2", "m1", "m3"}, db.Handled(t, "billing"))
	assert.Empty(t, db.Handled(t, "audit"))

	require.NoError(t, db.Close())
	_, err = db.Inbox.Handled(ctx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m1"})
	assert.Error(t, err, "the inbox's database is closed")
}

// The database is the file named by Path, in the test's TempDir, in WAL
// mode, whatever the test's name holds: '#' and '%' are not read as a
// URI's fragment or escape, which would open another file outside the
// test's directory, shared by every run.
func TestOpenInTheTestsTempDir(t *testing.T) {
	t.Parallel()
	t.Run("order #1 at 100%", func(t *testing.T) {
		db := sqlitetest.Open(t, invoices)
		_, err := os.Stat(db.Path)
		require.NoError(t, err, "the database file")
		var file string
		require.NoError(t, db.QueryRow("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file))
		assert.Equal(t, db.Path, file)
		var mode string
		require.NoError(t, db.Get(&mode, "PRAGMA journal_mode"))
		assert.Equal(t, "wal", mode)
	})
}
