package sqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestMigrateAddsTheIdentityColumnToAnOldVersionTable upgrades a database
// whose schema version table was created before tables had identities. The
// version table must be the test's own: on SQLite the test's database, on
// PostgreSQL and MariaDB a schema of its own, whose version table holds the
// rows of its tables only (the connection's own is shared by every test).
func TestMigrateAddsTheIdentityColumnToAnOldVersionTable(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		db := b.Open(t)
		versions, table := `"`+sqlstore.VersionTable+`"`, "orders"
		columns := "table_name TEXT PRIMARY KEY, version INTEGER NOT NULL, completion TEXT NOT NULL"
		switch b.Dialect.Name() {
		case "sqlite":
		case "mysql":
			schema := testenv.Schema(t, db, b.Dialect, "old_versions")
			versions, table = schema+"."+sqlstore.VersionTable, schema+".orders"
			columns = "table_name VARCHAR(64) NOT NULL PRIMARY KEY, version INT NOT NULL, completion VARCHAR(16) NOT NULL"
		default:
			schema := testenv.Schema(t, db, b.Dialect, "old_versions")
			versions, table = schema+"."+sqlstore.VersionTable, schema+".orders"
		}
		_, err := db.ExecContext(testCtx(t), "CREATE TABLE "+versions+" ("+columns+")")
		require.NoError(t, err)
		old, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, DB: db})
		require.NoError(t, err)
		// The release before identities wrote its row without one.
		require.NoError(t, old.MigrateTo(testCtx(t), 3))
		recs := testRecords(2)
		require.NoError(t, old.Insert(testCtx(t), recs))

		current, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, DB: db})
		require.NoError(t, err)
		require.NoError(t, current.Migrate(testCtx(t)))
		require.NoError(t, current.Verify(testCtx(t)))
		id, err := current.Identity(testCtx(t))
		require.NoError(t, err)
		assert.Len(t, id, 32)
		pending, err := current.PendingAfter(testCtx(t), "orders", 0, 10)
		require.NoError(t, err)
		assert.Len(t, pending, 2)
	})
}
