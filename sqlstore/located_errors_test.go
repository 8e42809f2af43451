package sqlstore_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestMigrateAndVerifyErrorsNameTheDatabase checks that the errors of
// Migrate and Verify say which dialect and database they were about, and
// keep their sentinels.
func TestMigrateAndVerifyErrorsNameTheDatabase(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		db := b.Open(t)
		var database string
		switch b.Dialect.Name() {
		case "sqlite":
			require.NoError(t, db.GetContext(testCtx(t), &database, "SELECT file FROM pragma_database_list WHERE name = 'main'"))
		default:
			database = "test"
		}
		where := "(" + b.Dialect.Name() + ", database " + database + ")"

		missing, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: testenv.Table(t), DB: db})
		require.NoError(t, err)
		err = missing.Verify(testCtx(t))
		require.ErrorIs(t, err, sqlstore.ErrTableMissing)
		assert.Contains(t, err.Error(), `sqlstore: verify on table "`+missing.Table()+`" `+where+": table does not exist; create it with Store.Migrate")
		var te *sqlstore.TableError
		require.True(t, errors.As(err, &te))
		assert.Equal(t, b.Dialect.Name(), te.Dialect)
		assert.Equal(t, database, te.Database)

		marking := testenv.NewStore(t, b, db, sqlstore.Mark)
		deleting, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: marking.Table(), Completion: sqlstore.Delete, DB: db})
		require.NoError(t, err)
		err = deleting.Migrate(testCtx(t))
		require.ErrorIs(t, err, sqlstore.ErrSchemaVersion)
		assert.Contains(t, err.Error(), `sqlstore: migrate on table "`+marking.Table()+`" `+where+`: `)
		err = deleting.Verify(testCtx(t))
		require.ErrorIs(t, err, sqlstore.ErrSchemaVersion)
		assert.Contains(t, err.Error(), where)

		err = detached(t, b).Migrate(testCtx(t))
		require.ErrorIs(t, err, sqlstore.ErrNoDB)
		assert.Contains(t, err.Error(), "("+b.Dialect.Name()+")", "no database to name")
	})
}

func detached(t *testing.T, b testenv.Backend) *sqlstore.Store {
	s, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect})
	require.NoError(t, err)
	return s
}
