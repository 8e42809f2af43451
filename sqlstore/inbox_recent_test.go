package sqlstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestInboxRecent: Recent lists the latest entries first, at most the
// limit, each as it was stored (sender, record, business key) with how long
// ago it was handled.
func TestInboxRecent(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		in := newInbox(t, b, b.Open(t))
		ctx := testCtx(t)
		entries := []recordstore.InboxEntry{
			{Consumer: "billing", MessageUUID: "m-oldest", Source: "orders-service", RecordID: 1},
			{Consumer: "shipping", MessageUUID: "m-older", BusinessKey: "order-7", Source: "payments-service", RecordID: 2},
			{Consumer: "billing", MessageUUID: "m-latest", RecordID: 0},
		}
		for _, e := range entries {
			require.NoError(t, in.MarkHandled(ctx, e))
		}
		setHandledAt(t, in, entries[0], "2000-01-01 00:00:00")
		setHandledAt(t, in, entries[1], "2010-01-01 00:00:00")

		got, err := in.Recent(ctx, 2)
		require.NoError(t, err)
		require.Len(t, got, 2)
		assert.Equal(t, []recordstore.InboxEntry{entries[2], entries[1]}, []recordstore.InboxEntry{got[0].InboxEntry, got[1].InboxEntry})
		assert.Less(t, got[0].Age, time.Hour, "handled just now")
		assert.Greater(t, got[1].Age, 10*365*24*time.Hour)

		got, err = in.Recent(ctx, 10)
		require.NoError(t, err)
		require.Len(t, got, 3)
		assert.Equal(t, entries[0], got[2].InboxEntry)

		_, err = in.Recent(ctx, 0)
		assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
	})
}

func setHandledAt(t *testing.T, in *sqlstore.Inbox, e recordstore.InboxEntry, at string) {
	t.Helper()
	db := in.DB()
	_, err := db.ExecContext(t.Context(), db.Rebind("UPDATE "+in.Table()+" SET handled_at = ? WHERE consumer = ? AND message_uuid = ?"), at, e.Consumer, e.MessageUUID)
	require.NoError(t, err)
}
