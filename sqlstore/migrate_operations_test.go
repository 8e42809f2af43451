package sqlstore_test

import (
	"io/fs"
	"path"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// firstMigrationOnly is the embedded migrations of the dialect up to 001, as
// the first release shipped them.
func firstMigrationOnly(t *testing.T, d sqlstore.Dialect) fs.FS {
	t.Helper()
	name := path.Join("migrations", d.Name(), "001_create_table.sql")
	text, err := fs.ReadFile(sqlstore.MigrationFiles, name)
	require.NoError(t, err)
	return fstest.MapFS{name: &fstest.MapFile{Data: text}}
}

// TestMigrateAddsOperationsToAFirstReleaseTable upgrades a table created by
// the first release, with records in it, to the operational columns: the
// pending records stay pending and can be counted, claimed and abandoned.
func TestMigrateAddsOperationsToAFirstReleaseTable(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
			t.Run(b.Name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				db := b.Open(t)
				table := testenv.Table(t)
				old, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: mode, DB: db})
				require.NoError(t, err)
				t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, table) })
				sqlstore.UseMigrations(old, firstMigrationOnly(t, b.Dialect))
				require.NoError(t, old.Migrate(testCtx(t)))
				recs := testRecords(3)
				require.NoError(t, old.Insert(testCtx(t), recs))
				require.NoError(t, old.Complete(testCtx(t), recs[0].ID))

				current, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: mode, DB: db})
				require.NoError(t, err)
				require.ErrorIs(t, current.Verify(testCtx(t)), sqlstore.ErrSchemaVersion)
				require.NoError(t, current.Migrate(testCtx(t)))
				require.NoError(t, current.Verify(testCtx(t)))

				pending, err := current.PendingAfter(testCtx(t), "orders", 0, 10)
				require.NoError(t, err)
				require.Len(t, pending, 2, "the upgrade keeps the pending records pending")
				n, abandoned, err := current.RecordFailure(testCtx(t), recs[1].ID, "boom", 1)
				require.NoError(t, err)
				assert.Equal(t, 1, n, "old records start with no attempts")
				assert.True(t, abandoned)
				_, _, err = current.RecordFailure(testCtx(t), recs[0].ID, "boom", 1)
				assert.ErrorIs(t, err, outbox.ErrNotPending, "a record completed before the upgrade stays completed")
			})
		}
	}
}
