package sqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestMigrateAddsTheIdentityColumnToAnOldVersionTable upgrades a database
// whose schema version table was created before tables had identities. It
// runs on SQLite, whose database is the test's own: the version table of the
// other databases is shared by every test.
func TestMigrateAddsTheIdentityColumnToAnOldVersionTable(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	_, err := db.ExecContext(testCtx(t), `CREATE TABLE "`+sqlstore.VersionTable+`" (
    table_name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    completion TEXT NOT NULL
)`)
	require.NoError(t, err)
	old, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), Table: "orders", DB: db})
	require.NoError(t, err)
	// The release before identities wrote its row without one.
	require.NoError(t, old.MigrateTo(testCtx(t), 3))
	recs := testRecords(2)
	require.NoError(t, old.Insert(testCtx(t), recs))

	current, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), Table: "orders", DB: db})
	require.NoError(t, err)
	require.NoError(t, current.Migrate(testCtx(t)))
	require.NoError(t, current.Verify(testCtx(t)))
	id, err := current.Identity(testCtx(t))
	require.NoError(t, err)
	assert.Len(t, id, 32)
	pending, err := current.PendingAfter(testCtx(t), "orders", 0, 10)
	require.NoError(t, err)
	assert.Len(t, pending, 2)
}
