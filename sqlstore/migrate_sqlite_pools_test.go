package sqlstore_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestMigrateFromEightSQLitePools migrates one table of one SQLite file
// from 8 pools at once, 5 rounds, as 8 instances starting together would:
// every Migrate succeeds. Topology: SQLite (WAL, busy timeout), 8 pools of
// one connection each on one file.
func TestMigrateFromEightSQLitePools(t *testing.T) {
	dsn := testenv.SQLiteDSN(t)
	for round := range 5 {
		table := testenv.Table(t)
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			db := testenv.Open(t, "SQLite", "sqlite", dsn)
			db.SetMaxOpenConns(1)
			store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), Table: table, DB: db})
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = store.Migrate(testCtx(t))
			}()
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "round %d, pool %d", round, i)
		}
	}
}
