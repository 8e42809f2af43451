package sqlstore

import (
	"context"
	"database/sql"
	"sync"

	"github.com/jmoiron/sqlx"
)

// maxPrepared bounds the statements one pool keeps prepared; beyond it
// they run unprepared.
const maxPrepared = 128

// stmtCache keeps the statements of an ordered topic's checks and
// put-backs prepared on the store's pool, for a driver that parses every
// statement it is given (modernc.org/sqlite spent longer parsing the
// ordered check than running it). database/sql prepares a cached
// statement once on each connection that runs it. The unordered path runs
// its statements as they are: prepared, it cost no less in the benchmark.
type stmtCache struct {
	mu sync.RWMutex
	m  map[string]*sql.Stmt
}

func newStmtCache() *stmtCache { return &stmtCache{m: make(map[string]*sql.Stmt)} }

// get returns query prepared on db, or nil when it cannot be (the cache is
// full, or preparing failed: running the statement reports the error).
func (c *stmtCache) get(ctx context.Context, db *sqlx.DB, query string) *sql.Stmt {
	c.mu.RLock()
	st, ok := c.m[query]
	full := len(c.m) >= maxPrepared
	c.mu.RUnlock()
	if ok || full {
		return st
	}
	st, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.m[query]; ok {
		_ = st.Close()
		return prev
	}
	if len(c.m) >= maxPrepared {
		_ = st.Close()
		return nil
	}
	c.m[query] = st
	return st
}

// prepared returns query prepared on the store's pool when db is that pool
// and the dialect prepares; nil otherwise.
func (s *Store) prepared(ctx context.Context, db executor, query string) *sql.Stmt {
	a := s.att.Load()
	if a == nil || a.stmts == nil {
		return nil
	}
	if pool, ok := db.(*sqlx.DB); ok && pool == a.db {
		return a.stmts.get(ctx, pool, query)
	}
	return nil
}

// queryRow is db.QueryRowContext, through a prepared statement where the
// dialect prepares.
func (s *Store) queryRow(ctx context.Context, db executor, query string, args ...any) *sql.Row {
	if st := s.prepared(ctx, db, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return db.QueryRowContext(ctx, query, args...)
}

// execContext is db.ExecContext, through a prepared statement where the
// dialect prepares.
func (s *Store) execContext(ctx context.Context, db executor, query string, args ...any) (sql.Result, error) {
	if st := s.prepared(ctx, db, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return db.ExecContext(ctx, query, args...)
}
