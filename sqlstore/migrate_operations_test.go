package sqlstore_test

import (
	"io/fs"
	"path"
	"testing"
	"testing/fstest"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// firstMigrationOnly is the embedded migrations of the dialect up to 001, as
// the first release shipped them.
func firstMigrationOnly(t *testing.T, d *sqlstore.Dialect) fs.FS {
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
				completeAsTheFirstRelease(t, db, b.Dialect, mode, table, recs[0].ID)

				current, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: mode, DB: db})
				require.NoError(t, err)
				require.ErrorIs(t, current.Verify(testCtx(t)), sqlstore.ErrSchemaVersion)
				require.NoError(t, current.Migrate(testCtx(t)))
				require.NoError(t, current.Verify(testCtx(t)))

				pending, err := current.PendingAfter(testCtx(t), "orders", 0, 10)
				require.NoError(t, err)
				require.Len(t, pending, 2, "the upgrade keeps the pending records pending")
				n, abandoned, err := current.RecordFailure(testCtx(t), delivery(recs[1].ID), "boom", 1, nil)
				require.NoError(t, err)
				assert.Equal(t, 1, n, "old records start with no attempts")
				assert.True(t, abandoned)
				_, _, err = current.RecordFailure(testCtx(t), delivery(recs[0].ID), "boom", 1, nil)
				assert.ErrorIs(t, err, outbox.ErrNotPending, "a record completed before the upgrade stays completed")
			})
		}
	}
}

// completeAsTheFirstRelease completes a record with the statement of the
// first release, whose table has none of the later columns the store's own
// completion uses.
func completeAsTheFirstRelease(t *testing.T, db *sqlx.DB, d *sqlstore.Dialect, mode sqlstore.Completion, table string, id int64) {
	t.Helper()
	now := map[string]string{"postgres": "now()", "mysql": "UTC_TIMESTAMP(6)", "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')"}[d.Name()]
	q := "UPDATE " + table + " SET processed_at = " + now + " WHERE id = ? AND processed_at IS NULL"
	if mode == sqlstore.Delete {
		q = "DELETE FROM " + table + " WHERE id = ?"
	}
	res, err := db.ExecContext(testCtx(t), db.Rebind(q), id)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

// TestMigrateCompletesAMigrationCutShortOnMySQL runs migration 002's DDL on a
// version-1 table without writing the version, as a process killed between
// MySQL's self-committing DDL statements leaves it; Migrate must then complete
// the upgrade rather than fail on the columns that exist.
func TestMigrateCompletesAMigrationCutShortOnMySQL(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		if b.Dialect.Name() != "mysql" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			db := b.Open(t)
			table := testenv.Table(t)
			old, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: sqlstore.Mark, DB: db})
			require.NoError(t, err)
			t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, table) })
			sqlstore.UseMigrations(old, firstMigrationOnly(t, b.Dialect))
			require.NoError(t, old.Migrate(testCtx(t)))
			_, err = db.ExecContext(testCtx(t), "ALTER TABLE `"+table+"` ADD COLUMN attempts INT NOT NULL DEFAULT 0, ADD COLUMN last_error TEXT NULL, ADD COLUMN last_sent_at DATETIME(6) NULL, ADD COLUMN abandoned_at DATETIME(6) NULL")
			require.NoError(t, err)

			current, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: sqlstore.Mark, DB: db})
			require.NoError(t, err)
			require.NoError(t, current.Migrate(testCtx(t)))
			require.NoError(t, current.Verify(testCtx(t)))
			var keys []string
			require.NoError(t, db.SelectContext(testCtx(t), &keys,
				"SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? ORDER BY index_name", table))
			assert.Equal(t, []string{"PRIMARY", table + "_abandoned", table + "_order", table + "_origin", table + "_pending", table + "_processed"}, keys,
				"the statements after the one already applied ran")
		})
	}
}
