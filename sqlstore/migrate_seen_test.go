package sqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestMigrateRenamesTheReceiversTable upgrades a table whose consumers seen
// are in <table>_receivers, as the releases before the rename kept them:
// the table is renamed <table>_seen in place, with its rows. On MySQL,
// whose RENAME TABLE commits on its own, a migration cut short after the
// rename completes on a rerun, from the version before the rename or from
// one before the old table was created.
func TestMigrateRenamesTheReceiversTable(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			db := b.Open(t)
			table := testenv.Table(t)
			t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, table) })
			current, err := sqlstore.SchemaVersion(b.Dialect)
			require.NoError(t, err)
			before := current - 1
			old, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, DB: db})
			require.NoError(t, err)
			require.NoError(t, old.MigrateTo(ctx, before))
			_, err = db.ExecContext(ctx, db.Rebind("INSERT INTO "+table+"_receivers (topic, consumer, first_seen_at, last_seen_at) VALUES (?, ?, ?, ?)"),
				"orders", "billing", "2024-01-01 00:00:00", "2024-01-01 00:00:00")
			require.NoError(t, err)

			store, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, DB: db})
			require.NoError(t, err)
			keepsTheRow := func(msg string) {
				t.Helper()
				seen, err := store.Operator().ConsumersSeen(ctx)
				require.NoError(t, err, msg)
				assert.Contains(t, seen["orders"], "billing", msg)
			}
			require.NoError(t, store.Migrate(ctx))
			require.NoError(t, store.Verify(ctx))
			keepsTheRow("the migration keeps the rows")
			var n int
			require.Error(t, db.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+table+"_receivers"), "the old name is gone")
			require.NoError(t, store.SawConsumer(ctx, "orders", "shipping"))

			if b.Dialect.Name() != "mysql" {
				return
			}
			for _, from := range []int{before, 5} {
				_, err = db.ExecContext(ctx, "UPDATE "+sqlstore.VersionTable+" SET version = ? WHERE table_name = ?", from, table)
				require.NoError(t, err)
				require.NoError(t, store.Migrate(ctx), "a rerun from version %d", from)
				require.NoError(t, store.Verify(ctx))
				keepsTheRow("a rerun keeps the rows")
			}
		})
	}
}
