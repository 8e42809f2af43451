package sqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"modernc.org/sqlite"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestDialectDriverMismatch gives every database's pool the dialects of the
// other two: New refuses them, and a store the pool is attached to refuses
// it at its first use, naming the dialect and the driver.
func TestDialectDriverMismatch(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		db := b.Open(t)
		for _, d := range []*sqlstore.Dialect{sqlstore.Postgres(), sqlstore.MySQL(), sqlstore.SQLite()} {
			if d.Name() == b.Dialect.Name() {
				continue
			}
			t.Run(d.Name(), func(t *testing.T) {
				_, err := sqlstore.New(sqlstore.Config{Dialect: d, DB: db})
				require.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
				assert.Contains(t, err.Error(), "the "+d.Name()+" dialect does not fit the pool's driver "+db.DriverName())
				assert.Contains(t, err.Error(), "a "+b.Dialect.Name()+" driver")

				s, err := sqlstore.New(sqlstore.Config{Dialect: d})
				require.NoError(t, err)
				s.Attach(db)
				err = s.Migrate(testCtx(t))
				require.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
				assert.Contains(t, err.Error(), "does not fit the pool's driver")
				_, err = s.Status(testCtx(t))
				assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
			})
		}
		t.Run("Matching", func(t *testing.T) {
			_, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, DB: db})
			assert.NoError(t, err)
		})
	})
}

// wrappedDriver stands for an instrumented driver, which says nothing about
// the database behind it.
type wrappedDriver struct{ driver.Driver }

func init() { sql.Register("wrapped-sqlite", wrappedDriver{&sqlite.Driver{}}) }

func TestUnknownDriverIsAccepted(t *testing.T) {
	t.Parallel()
	db, err := sqlx.Open("wrapped-sqlite", testenv.SQLiteDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	for _, d := range []*sqlstore.Dialect{sqlstore.Postgres(), sqlstore.MySQL(), sqlstore.SQLite()} {
		_, err := sqlstore.New(sqlstore.Config{Dialect: d, DB: db})
		assert.NoError(t, err, d.Name())
	}
}

// TestDriverKnownByName covers pools whose driver type is not known but
// whose sqlx driver name is.
func TestDriverKnownByName(t *testing.T) {
	t.Parallel()
	db := sqlx.NewDb(sql.OpenDB(wrappedConnector{}), "pgx")
	t.Cleanup(func() { _ = db.Close() })
	_, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db})
	require.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "driver pgx, a postgres driver")
}

type wrappedConnector struct{}

func (wrappedConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("never connects")
}
func (wrappedConnector) Driver() driver.Driver { return wrappedDriver{} }
