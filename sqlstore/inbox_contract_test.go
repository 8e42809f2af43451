package sqlstore_test

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
	"github.com/wmoutbox/outbox/sqlstore/storetest"
)

func TestInboxContract(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		storetest.RunInbox(t, storetest.InboxContract{
			New: func(t *testing.T) recordstore.Inbox {
				return newInbox(t, b, b.Open(t))
			},
			Begin: func(ctx context.Context, in recordstore.Inbox) (recordstore.Tx, error) {
				return in.(*sqlstore.Inbox).DB().BeginTxx(ctx, nil)
			},
			Age: func(t testing.TB, in recordstore.Inbox, consumer, messageUUID string) {
				ageInboxEntry(t, in.(*sqlstore.Inbox), consumer, messageUUID)
			},
			MaxField: sqlstore.MaxInboxField,
		})
	})
}

// newInbox creates an inbox on a fresh table of the backend, migrated and
// dropped when the test ends.
func newInbox(t *testing.T, b testenv.Backend, db *sqlx.DB) *sqlstore.Inbox {
	t.Helper()
	table := testenv.Table(t)
	in, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db, Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, table) })
	require.NoError(t, in.Migrate(testCtx(t)))
	return in
}

// ageInboxEntry moves an entry's handled_at to long ago, as the database
// clock would have stamped it then.
func ageInboxEntry(t testing.TB, in *sqlstore.Inbox, consumer, messageUUID string) {
	t.Helper()
	db := in.DB()
	res, err := db.ExecContext(t.Context(), db.Rebind("UPDATE "+in.Table()+" SET handled_at = ? WHERE consumer = ? AND message_uuid = ?"),
		"2000-01-01 00:00:00", consumer, messageUUID)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the entry to age")
}
