package sqlstore_test

import (
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func TestInboxMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		db := b.Open(t)
		ctx := testCtx(t)
		table := testenv.Table(t)
		in, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db, Table: table})
		require.NoError(t, err)
		t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, table) })
		assert.ErrorIs(t, in.Verify(ctx), sqlstore.ErrTableMissing, "before Migrate")

		require.NoError(t, in.Migrate(ctx))
		e := recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m1"}
		require.NoError(t, in.MarkHandled(ctx, e))
		require.NoError(t, in.Migrate(ctx), "a second Migrate")
		require.NoError(t, in.Verify(ctx))
		ok, err := in.Handled(ctx, e)
		require.NoError(t, err)
		assert.True(t, ok, "the second Migrate kept the entries")

		want, err := sqlstore.InboxSchemaVersion(b.Dialect)
		require.NoError(t, err)
		var row struct {
			Version    int    `db:"version"`
			Completion string `db:"completion"`
		}
		require.NoError(t, db.GetContext(ctx, &row, db.Rebind("SELECT version, completion FROM "+sqlstore.VersionTable+" WHERE table_name = ?"), table))
		assert.Equal(t, want, row.Version)
		assert.Equal(t, "inbox", row.Completion, "the version row says the table is an inbox")
	})
}

// TestInboxBesideRecordTable: an inbox and a record table with their
// default names live in one database, each with its own version row, and
// neither takes the other's table.
func TestInboxBesideRecordTable(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		db := defaultNamesDB(t, b)
		ctx := testCtx(t)
		store, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, DB: db})
		require.NoError(t, err)
		in, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db})
		require.NoError(t, err)
		require.Equal(t, sqlstore.DefaultTable, store.Table())
		require.Equal(t, sqlstore.DefaultInboxTable, in.Table())

		require.NoError(t, store.Migrate(ctx))
		require.NoError(t, in.Migrate(ctx))
		require.NoError(t, store.Verify(ctx))
		require.NoError(t, in.Verify(ctx))
		require.NoError(t, store.Insert(ctx, testRecords(1)))
		require.NoError(t, in.MarkHandled(ctx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m1"}))
		var n int
		require.NoError(t, db.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+sqlstore.VersionTable))
		assert.Equal(t, 2, n, "one version row each")

		asStore, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, DB: db, Table: sqlstore.DefaultInboxTable})
		require.NoError(t, err)
		assert.ErrorIs(t, asStore.Migrate(ctx), sqlstore.ErrSchemaVersion, "a record store refuses the inbox's table")
		asInbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db, Table: sqlstore.DefaultTable})
		require.NoError(t, err)
		assert.ErrorIs(t, asInbox.Migrate(ctx), sqlstore.ErrSchemaVersion, "an inbox refuses the record table")
		assert.ErrorIs(t, asInbox.Verify(ctx), sqlstore.ErrSchemaVersion)
	})
}

// defaultNamesDB is a pool on a database of the test's own, where tables
// with the default names belong to no other test: a fresh SQLite file, or a
// fresh schema (on MariaDB, a database) that the pool finds unqualified
// names in.
func defaultNamesDB(t *testing.T, b testenv.Backend) *sqlx.DB {
	t.Helper()
	switch b.Dialect.Name() {
	case "sqlite":
		return b.Open(t)
	case "postgres":
		schema := testenv.Schema(t, b.Open(t), b.Dialect, "inbox")
		db := testenv.Open(t, "PostgreSQL", "pgx", testenv.PostgresDSN()+"&search_path="+schema)
		db.SetMaxOpenConns(4)
		return db
	default:
		schema := testenv.Schema(t, b.Open(t), b.Dialect, "inbox")
		dsn := strings.Replace(testenv.MySQLDSN(), "/test?", "/"+schema+"?", 1)
		require.NotEqual(t, testenv.MySQLDSN(), dsn, "the DSN names the database test")
		db := testenv.Open(t, "MariaDB", "mysql", dsn)
		db.SetMaxOpenConns(4)
		return db
	}
}

func TestInboxConfig(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	for _, tc := range []struct {
		name string
		cfg  sqlstore.InboxConfig
		want error
	}{
		{"NoDialect", sqlstore.InboxConfig{DB: db}, sqlstore.ErrInvalidConfig},
		{"ZeroDialect", sqlstore.InboxConfig{DB: db, Dialect: &sqlstore.Dialect{}}, sqlstore.ErrInvalidConfig},
		{"NoDB", sqlstore.InboxConfig{Dialect: sqlstore.SQLite()}, sqlstore.ErrInvalidConfig},
		{"InvalidTable", sqlstore.InboxConfig{Dialect: sqlstore.SQLite(), DB: db, Table: "inbox; DROP TABLE x"}, sqlstore.ErrInvalidTable},
		{"QualifiedOnSQLite", sqlstore.InboxConfig{Dialect: sqlstore.SQLite(), DB: db, Table: "main.inbox"}, sqlstore.ErrInvalidTable},
		{"VersionTable", sqlstore.InboxConfig{Dialect: sqlstore.SQLite(), DB: db, Table: sqlstore.VersionTable}, sqlstore.ErrInvalidTable},
		{"TooLong", sqlstore.InboxConfig{Dialect: sqlstore.SQLite(), DB: db, Table: strings.Repeat("t", 49)}, sqlstore.ErrInvalidTable},
		{"OtherDatabasesDriver", sqlstore.InboxConfig{Dialect: sqlstore.Postgres(), DB: db, Table: "inbox"}, sqlstore.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sqlstore.NewInbox(tc.cfg)
			assert.ErrorIs(t, err, tc.want)
			assert.ErrorIs(t, tc.cfg.Validate(), tc.want, "Validate says the same")
		})
	}
	in, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: sqlstore.SQLite(), DB: db})
	require.NoError(t, err)
	assert.Equal(t, sqlstore.DefaultInboxTable, in.Table(), "the default table")
}
