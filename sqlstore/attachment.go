package sqlstore

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// attachment is an attached pool and the dialect bound to the server behind
// it. It is immutable: probing a pool replaces its attachment with a bound
// one, so the hot path reads both with one atomic load.
type attachment struct {
	db *sqlx.DB
	// dialect is nil until a dialect that probes (Dialect.probe) has
	// probed db; dialects that do not probe are bound at once.
	dialect *Dialect
	// identity is the table's identity, once read through db.
	identity string
	// err refuses the pool: its driver is for another database.
	err error
	// stmts are the statements prepared on db, when the dialect prepares.
	stmts *stmtCache
}

// Attach sets (or replaces) the connection pool. It is safe to call while the
// store is in use. A MySQL store looks at the server behind a new pool once,
// at its first Insert, Migrate or Verify. A pool whose driver is for another
// database than the store's dialect (see [New]) is refused at its first use,
// with an error wrapping [ErrInvalidConfig].
func (s *Store) Attach(db *sqlx.DB) {
	a := &attachment{db: db, err: checkDriver(s.dialect, db)}
	if s.dialect.probe == nil {
		a.dialect = s.dialect
	}
	if s.dialect.prepare && db != nil {
		a.stmts = newStmtCache()
	}
	// The old pool's prepared statements are not closed: a call may
	// still be about to run one. They go with their pool when it closes.
	s.att.Store(a)
}

// DB returns the attached pool, or nil.
func (s *Store) DB() *sqlx.DB {
	if a := s.att.Load(); a != nil {
		return a.db
	}
	return nil
}

// pool returns the attached pool, for the statements that are the same
// whatever the server.
func (s *Store) pool() (*sqlx.DB, error) {
	a := s.att.Load()
	if a == nil || a.db == nil {
		return nil, fmt.Errorf("%w for table %q", ErrNoDB, s.table)
	}
	if a.err != nil {
		return nil, a.err
	}
	return a.db, nil
}

// bound returns the attached pool and the dialect bound to its server,
// probing the server the first time.
func (s *Store) bound(ctx context.Context) (*sqlx.DB, *Dialect, error) {
	for {
		a := s.att.Load()
		if a == nil || a.db == nil {
			return nil, nil, fmt.Errorf("%w for table %q", ErrNoDB, s.table)
		}
		if a.err != nil {
			return nil, nil, a.err
		}
		if a.dialect != nil {
			return a.db, a.dialect, nil
		}
		d, err := s.probe(ctx, a)
		if err != nil {
			return nil, nil, err
		}
		if d != nil {
			return a.db, d, nil
		}
	}
}

// probe binds the dialect to the server of a, unless a is no longer the
// attachment (another call probed it, or a new pool was attached), in which
// case it returns nil and the caller looks again.
func (s *Store) probe(ctx context.Context, a *attachment) (*Dialect, error) {
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if s.att.Load() != a {
		return nil, nil
	}
	d, err := s.dialect.probe(ctx, a.db)
	if err != nil {
		return nil, s.fail("probe server", err)
	}
	s.att.Store(&attachment{db: a.db, dialect: d, identity: a.identity, err: a.err, stmts: a.stmts})
	return d, nil
}
