package sqlstore

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// OpenTable returns a store for a table that [Store.Migrate] created, in
// the completion mode the table was created with, read from
// [VersionTable], and verified as [Store.Verify] does. It is for tools that
// inspect a table they did not configure, such as outboxctl; a service
// knows its mode and calls [New]. An empty table means [DefaultTable].
//
// A missing table is an error wrapping [ErrTableMissing]; a table of
// another schema version one wrapping [ErrSchemaVersion].
func OpenTable(ctx context.Context, db *sqlx.DB, d *Dialect, table string) (*Store, error) {
	probe, err := New(Config{Dialect: d, Table: table, DB: db})
	if err != nil {
		return nil, err
	}
	mode, err := probe.createdMode(ctx)
	if err != nil {
		return nil, probe.located(ctx, "open", err)
	}
	s := probe
	if mode != probe.mode {
		if s, err = New(Config{Dialect: d, Table: table, Completion: mode, DB: db}); err != nil {
			return nil, err
		}
	}
	if err := s.Verify(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// createdMode reads the completion mode the table was created with.
func (s *Store) createdMode(ctx context.Context) (Completion, error) {
	db, err := s.pool()
	if err != nil {
		return 0, err
	}
	version, mode, err := s.readVersion(ctx, db)
	switch {
	case err != nil:
		return 0, err
	case version == 0:
		return 0, &TableError{Table: s.table, Op: "open", Err: ErrTableMissing}
	}
	for _, c := range []Completion{Mark, Delete} {
		if mode == c.String() {
			return c, nil
		}
	}
	return 0, &TableError{Table: s.table, Op: "open", Err: fmt.Errorf("%w: unknown completion %q in %s", ErrSchemaVersion, mode, VersionTable)}
}
