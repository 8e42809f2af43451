package sqlstore_test

import (
	"fmt"
	"io/fs"
	"path"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// withNextMigration is the embedded migrations of the dialect plus one more,
// as the next release of the code would have them.
func withNextMigration(t *testing.T, d *sqlstore.Dialect) fs.FS {
	t.Helper()
	dir := path.Join("migrations", d.Name())
	files := fstest.MapFS{}
	entries, err := fs.ReadDir(sqlstore.MigrationFiles, dir)
	require.NoError(t, err)
	for _, e := range entries {
		text, err := fs.ReadFile(sqlstore.MigrationFiles, path.Join(dir, e.Name()))
		require.NoError(t, err)
		files[path.Join(dir, e.Name())] = &fstest.MapFile{Data: text}
	}
	next, err := sqlstore.SchemaVersion(d)
	require.NoError(t, err)
	name := path.Join(dir, fmt.Sprintf("%03d_touch.sql", next+1))
	files[name] = &fstest.MapFile{Data: []byte("UPDATE {{.Table}} SET uuid = uuid WHERE 1 = 0;\n")}
	return files
}

// TestMigrateOlderAndNewerCode runs two releases of the code against one
// table: the newer one finds the table older than it needs and upgrades it;
// the older one then finds it newer and refuses it.
func TestMigrateOlderAndNewerCode(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			db := b.Open(t)
			current := testenv.NewStore(t, b, db, sqlstore.Mark)
			recs := testRecords(3)
			require.NoError(t, current.Insert(testCtx(t), recs))
			want, err := sqlstore.SchemaVersion(b.Dialect)
			require.NoError(t, err)

			next, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: current.Table(), Completion: sqlstore.Mark, DB: db})
			require.NoError(t, err)
			sqlstore.UseMigrations(next, withNextMigration(t, b.Dialect))

			err = next.Verify(testCtx(t))
			require.ErrorIs(t, err, sqlstore.ErrSchemaVersion)
			assert.Contains(t, err.Error(), current.Table())
			assert.Contains(t, err.Error(), "run Store.Migrate", "an older table says how to upgrade it")

			require.NoError(t, next.Migrate(testCtx(t)))
			require.NoError(t, next.Verify(testCtx(t)))
			got, err := next.PendingAfter(testCtx(t), "orders", 0, 10)
			require.NoError(t, err)
			assert.Len(t, got, len(recs), "upgrading keeps the records")

			err = current.Verify(testCtx(t))
			require.ErrorIs(t, err, sqlstore.ErrSchemaVersion)
			assert.Contains(t, err.Error(), "upgrade the code", "a newer table says the code is behind")
			require.ErrorIs(t, current.Migrate(testCtx(t)), sqlstore.ErrSchemaVersion)

			var version int
			require.NoError(t, db.GetContext(testCtx(t), &version,
				db.Rebind("SELECT version FROM "+sqlstore.VersionTable+" WHERE table_name = ?"), current.Table()))
			assert.Equal(t, want+1, version)
		})
	}
}
