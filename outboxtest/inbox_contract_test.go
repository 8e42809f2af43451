package outboxtest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore/storetest"
)

func TestInboxContract(t *testing.T) {
	t.Parallel()
	storetest.RunInbox(t, storetest.InboxContract{
		New: func(*testing.T) recordstore.Inbox { return NewInbox() },
		Begin: func(context.Context, recordstore.Inbox) (recordstore.Tx, error) {
			return NewTx(), nil
		},
		Age: func(t testing.TB, inbox recordstore.Inbox, consumer, messageUUID string) {
			in := inbox.(*Inbox)
			in.mu.Lock()
			defer in.mu.Unlock()
			x := in.byUUID[inboxKey{consumer, messageUUID}]
			require.NotNil(t, x, "the entry to age")
			x.handledAt = storetest.LongAgo
		},
	})
}

func TestInboxRefusesTransactionsItCannotFollow(t *testing.T) {
	t.Parallel()
	in := NewInbox()
	var tx *sql.Tx // any transaction but a Tx of this package
	err := in.MarkHandledTx(t.Context(), tx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m1"})
	assert.ErrorIs(t, err, recordstore.ErrNotSupported)
	assert.ErrorContains(t, err, "outboxtest/sqlitetest", "the error names the fix")
	assert.Empty(t, in.Entries())
}

func TestTxRunsNoSQL(t *testing.T) {
	t.Parallel()
	tx := NewTx()
	_, err := tx.ExecContext(t.Context(), "SELECT 1")
	assert.ErrorIs(t, err, ErrNoDatabase)
	_, err = tx.QueryContext(t.Context(), "SELECT 1") //nolint:rowserrcheck,sqlclosecheck // no rows
	assert.ErrorIs(t, err, ErrNoDatabase)
	var one int
	assert.ErrorIs(t, tx.QueryRowContext(t.Context(), "SELECT 1").Scan(&one), ErrNoDatabase)
	require.NoError(t, tx.Commit())
	assert.ErrorIs(t, tx.Rollback(), sql.ErrTxDone)
	in := NewInbox()
	assert.ErrorIs(t, in.MarkHandledTx(t.Context(), tx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m1"}), sql.ErrTxDone,
		"an ended transaction saves nothing")
	assert.Empty(t, in.Entries())
}

func TestInboxEntries(t *testing.T) {
	t.Parallel()
	in := NewInbox()
	first := recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m1", BusinessKey: "order-1"}
	require.NoError(t, in.MarkHandled(t.Context(), first))
	tx := NewTx()
	held := recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m2"}
	require.NoError(t, in.MarkHandledTx(t.Context(), tx, held))
	assert.Equal(t, []recordstore.InboxEntry{first}, in.Entries(), "an entry held for a transaction is not listed")
	require.NoError(t, tx.Commit())
	assert.Equal(t, []recordstore.InboxEntry{first, held}, in.Entries())
}
