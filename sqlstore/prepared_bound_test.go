package sqlstore

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"
)

// TestPreparedStatementsAreBounded: texts built per call never make a
// pool's cache grow past its bound; beyond it they run unprepared, and a
// text that does not parse is not cached and reports its error when run.
func TestPreparedStatementsAreBounded(t *testing.T) {
	t.Parallel()
	db, err := sqlx.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "p.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	s := &Store{}
	s.att.Store(&attachment{db: db, stmts: newStmtCache()})
	ctx := context.Background()
	_, err = s.execContext(ctx, db, "SELEC 1")
	require.Error(t, err)
	assert.Empty(t, s.att.Load().stmts.m, "a text that does not parse is not kept")
	for i := range maxPrepared + 20 {
		var n int
		require.NoError(t, s.queryRow(ctx, db, fmt.Sprintf("SELECT %d", i)).Scan(&n))
		assert.Equal(t, i, n)
	}
	assert.Len(t, s.att.Load().stmts.m, maxPrepared)
	var n int
	require.NoError(t, s.queryRow(ctx, db, "SELECT 0").Scan(&n), "a cached statement runs again")
	tx, err := db.Beginx()
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // read only
	assert.Nil(t, s.prepared(ctx, tx, "SELECT 0"), "a transaction's statements are not the pool's")
}
