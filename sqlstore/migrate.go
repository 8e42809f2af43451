package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/jmoiron/sqlx"
)

//go:embed migrations
var migrationFiles embed.FS

// VersionTable records the schema version, completion mode and identity of
// every outbox table in its schema, one row per table keyed by the table's
// name without its schema. Each schema has its own: the version table of
// "tenant_a.watermill_outbox" is "tenant_a.watermill_outbox_schema", and an
// unqualified table's is found as the table is (PostgreSQL's search_path,
// MySQL's current database).
const VersionTable = "watermill_outbox_schema"

type migration struct {
	version int
	name    string
	tmpl    *template.Template
}

var migrationName = regexp.MustCompile(`^(\d{3})_[a-z0-9_]+\.sql$`)

// loadMigrations reads the numbered migrations of a dialect from fsys, in
// order.
func loadMigrations(fsys fs.FS, dialect string) ([]migration, error) {
	dir := path.Join("migrations", dialect)
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: no migrations for dialect %q: %w", dialect, err)
	}
	var out []migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("sqlstore: migration file %s/%s is not named NNN_name.sql", dir, e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		text, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		t, err := template.New(e.Name()).Parse(string(text))
		if err != nil {
			return nil, fmt.Errorf("sqlstore: migration %s: %w", e.Name(), err)
		}
		out = append(out, migration{version: v, name: e.Name(), tmpl: t})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("sqlstore: migrations of %q are not numbered 1..n (found %03d at position %d)", dialect, m.version, i+1)
		}
	}
	return out, nil
}

// SchemaVersion is the version of the table schema this code expects for the
// dialect.
func SchemaVersion(d Dialect) (int, error) {
	ms, err := loadMigrations(migrationFiles, d.Name())
	if err != nil {
		return 0, err
	}
	return len(ms), nil
}

// templateData is what migration templates see. Every name in it is a
// validated identifier, quoted by the dialect. Tables are qualified by the
// schema, if any; index and key names never are: an index lives in its
// table's schema (PostgreSQL refuses a qualified name in CREATE INDEX), or
// belongs to its table (MySQL).
type templateData struct {
	d     Dialect
	table tableName
	Mark  bool
}

func (t templateData) Table() string { return t.table.quoted(t.d) }

func (t templateData) Index(suffix string) string { return t.d.quote(t.table.name + "_" + suffix) }

// ConsumersTable is the table of the per-consumer deliveries.
func (t templateData) ConsumersTable() string { return t.table.in(t.d, consumersTable(t.table.name)) }

// ConsumersIndex names an index or key of the consumers table, kept short
// so that it fits the identifier limit whatever the table (see
// validateTable).
func (t templateData) ConsumersIndex(suffix string) string {
	return t.d.quote(t.table.name + "_c_" + suffix)
}

// statements splits a rendered migration at semicolons that end a line.
func statements(sqlText string) []string {
	var out []string
	for _, s := range regexp.MustCompile(`;\s*(\n|$)`).Split(sqlText, -1) {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Migrate creates the table, or brings it to the current schema version. It
// is idempotent and safe to run from several processes at once on
// PostgreSQL and MySQL/MariaDB (it takes a lock for the duration).
//
// On PostgreSQL and SQLite a migration and its version change commit
// together. MySQL commits each DDL statement on its own, so there a failed
// migration may leave part of its work done; every migration is written so
// that running it again completes it.
func (s *Store) Migrate(ctx context.Context) error { return s.MigrateTo(ctx, 0) }

// MigrateTo is [Store.Migrate] up to the given schema version and no
// further; 0 means the current one ([SchemaVersion]). It lets an upgrade be
// staged, and tests build the tables of earlier releases. A table at a
// later version is left alone. Tables get their identity at version 4.
func (s *Store) MigrateTo(ctx context.Context, version int) error {
	return s.located(ctx, "migrate", s.migrateTo(ctx, version))
}

func (s *Store) migrateTo(ctx context.Context, version int) error {
	db, d, err := s.bound(ctx)
	if err != nil {
		return err
	}
	ms, err := loadMigrations(s.migrations, d.Name())
	if err != nil {
		return err
	}
	if version < 0 || version > len(ms) {
		return fmt.Errorf("%w: schema version %d does not exist (1 to %d)", ErrInvalidConfig, version, len(ms))
	}
	target := len(ms)
	if version > 0 {
		target = version
	}
	conn, err := db.Connx(ctx)
	if err != nil {
		return s.fail("migrate", err)
	}
	defer conn.Close()
	if locker, ok := d.(sessionLocker); ok {
		if err := locker.lockSession(ctx, conn, s.name.schema); err != nil {
			return s.fail("lock migrations", err)
		}
		defer func() {
			// The lock lives as long as the session: a connection that
			// cannot release it is discarded rather than pooled.
			if err := locker.unlockSession(context.WithoutCancel(ctx), conn, s.name.schema); err != nil {
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}()
	}
	return s.migrate(ctx, conn, d, ms, target)
}

// migrate runs the migrations the table lacks, in a transaction on conn.
func (s *Store) migrate(ctx context.Context, conn *sqlx.Conn, d Dialect, ms []migration, target int) error {
	tx, err := beginMigration(ctx, conn, d)
	if err != nil {
		return s.fail("migrate", err)
	}
	defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
	if lock := s.q.migrationLock; lock != "" {
		if _, err := tx.ExecContext(ctx, lock); err != nil {
			return s.fail("lock migrations", err)
		}
	}
	if err := s.prepareVersionTable(ctx, tx, d); err != nil {
		return err
	}
	version, mode, err := s.readVersion(ctx, tx)
	if err != nil {
		return err
	}
	if version > 0 && mode != s.mode.String() {
		return &TableError{Table: s.table, Op: "migrate", Err: fmt.Errorf("%w: table was created for completion %q, store is configured for %q", ErrSchemaVersion, mode, s.mode)}
	}
	if version > len(ms) {
		return &TableError{Table: s.table, Op: "migrate", Err: fmt.Errorf("%w: table is at version %d, newer than this code's %d", ErrSchemaVersion, version, len(ms))}
	}
	data := templateData{d: d, table: s.name, Mark: s.mode == Mark}
	if version >= target && target < len(ms) {
		return tx.Commit() // at or past the version asked for
	}
	for _, m := range ms[version:target] {
		var b strings.Builder
		if err := m.tmpl.Execute(&b, data); err != nil {
			return fmt.Errorf("sqlstore: render migration %s: %w", m.name, err)
		}
		for _, stmt := range statements(b.String()) {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				if r, ok := d.(rerunTolerant); ok && r.alreadyApplied(err) {
					continue
				}
				return s.fail("migration "+m.name, err)
			}
		}
	}
	identity, err := s.readIdentity(ctx, tx)
	if err != nil {
		return err
	}
	hasIdentity := identity != ""
	if identity == "" && target >= identityVersion {
		identity = newIdentity()
	}
	if version < target || identity != "" && !hasIdentity {
		if err := s.writeVersion(ctx, tx, version, target, identity); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return s.fail("migrate", err)
	}
	return nil
}

// migrationTx is the migration's transaction: database/sql's, or one begun
// with the dialect's own statement on conn.
type migrationTx interface {
	executor
	Commit() error
	Rollback() error
}

func beginMigration(ctx context.Context, conn *sqlx.Conn, d Dialect) (migrationTx, error) {
	b, ok := d.(immediateBeginner)
	if !ok {
		return conn.BeginTxx(ctx, nil)
	}
	if _, err := conn.ExecContext(ctx, b.beginImmediate()); err != nil {
		return nil, err
	}
	return &connTx{ctx: ctx, Conn: conn}, nil
}

// connTx is a transaction begun by a statement on a connection.
type connTx struct {
	ctx context.Context
	*sqlx.Conn
	done bool
}

func (t *connTx) Commit() error   { return t.end("COMMIT") }
func (t *connTx) Rollback() error { return t.end("ROLLBACK") }
func (t *connTx) end(stmt string) error {
	if t.done {
		return sql.ErrTxDone
	}
	_, err := t.ExecContext(context.WithoutCancel(t.ctx), stmt)
	// A COMMIT that failed leaves the transaction open for the Rollback.
	t.done = err == nil || stmt == "ROLLBACK"
	return err
}

// readVersion reads the table's row in the schema version table: version
// 0 when it has none. A qualified table whose schema is missing gets an
// error wrapping [ErrSchemaMissing] rather than [ErrTableMissing], whose
// remedy (Migrate) would not help.
func (s *Store) readVersion(ctx context.Context, q executor) (int, string, error) {
	var version int
	var mode string
	err := q.QueryRowContext(ctx, s.q.readVersion, s.name.name).Scan(&version, &mode)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", nil
	}
	if err != nil {
		err = s.fail("read schema version", err)
		if errors.Is(err, ErrTableMissing) && s.name.schema != "" {
			return 0, "", s.schemaMissing(ctx, q, err)
		}
		return 0, "", err
	}
	return version, mode, nil
}

// schemaMissing returns an error wrapping [ErrSchemaMissing] when the
// table's schema does not exist, err otherwise.
func (s *Store) schemaMissing(ctx context.Context, q executor, err error) error {
	var n int
	if qerr := q.QueryRowContext(ctx, s.q.schemaExists, s.name.schema).Scan(&n); qerr != nil || n > 0 {
		return err
	}
	return &TableError{Table: s.table, Op: "read schema version", Err: ErrSchemaMissing}
}

// writeVersion records the version the table is at, and its identity, in
// one statement: on MySQL, where the migration's DDL committed on its own,
// the version and the identity still appear together.
func (s *Store) writeVersion(ctx context.Context, q executor, from, to int, identity string) error {
	id := sql.NullString{String: identity, Valid: identity != ""}
	var err error
	if from == 0 {
		_, err = q.ExecContext(ctx, s.q.insertVersion, s.name.name, to, s.mode.String(), id)
	} else {
		_, err = q.ExecContext(ctx, s.q.updateVersion, to, id, s.name.name)
	}
	if err != nil {
		return s.fail("write schema version", err)
	}
	return nil
}

// Verify checks that the table exists at the schema version and completion
// mode this code expects. Its errors wrap [ErrTableMissing] or
// [ErrSchemaVersion] and say what to do.
func (s *Store) Verify(ctx context.Context) error {
	return s.located(ctx, "verify", s.verify(ctx))
}

func (s *Store) verify(ctx context.Context) error {
	db, d, err := s.bound(ctx)
	if err != nil {
		return err
	}
	ms, err := loadMigrations(s.migrations, d.Name())
	if err != nil {
		return err
	}
	want := len(ms)
	version, mode, err := s.readVersion(ctx, db)
	if errors.Is(err, ErrTableMissing) || (err == nil && version == 0) {
		return &TableError{Table: s.table, Op: "verify", Err: ErrTableMissing}
	}
	if err != nil {
		return err
	}
	switch {
	case mode != s.mode.String():
		return &TableError{Table: s.table, Op: "verify", Err: fmt.Errorf("%w: table was created for completion %q, store is configured for %q", ErrSchemaVersion, mode, s.mode)}
	case version < want:
		return &TableError{Table: s.table, Op: "verify", Err: fmt.Errorf("%w: table is at version %d, this code needs %d; run Store.Migrate", ErrSchemaVersion, version, want)}
	case version > want:
		return &TableError{Table: s.table, Op: "verify", Err: fmt.Errorf("%w: table is at version %d, newer than this code's %d; upgrade the code", ErrSchemaVersion, version, want)}
	}
	identity, err := s.readIdentity(ctx, db)
	if err != nil {
		return err
	}
	if identity == "" {
		return &TableError{Table: s.table, Op: "verify", Err: fmt.Errorf("%w: table has no identity; run Store.Migrate", ErrSchemaVersion)}
	}
	s.cacheIdentity(db, identity)
	return nil
}

// located makes an error of Migrate or Verify a [*TableError] that names
// the dialect and the database. The database is asked for only once the
// failed call has given back its connections (a SQLite pool may have one),
// and briefly: an unreachable server leaves it unnamed.
func (s *Store) located(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	dialect, database := s.dialect.Name(), s.databaseName(ctx)
	if te, ok := err.(*TableError); ok { //nolint:errorlint // only the outermost error is completed; a wrapped one is wrapped
		located := *te
		located.Dialect, located.Database = dialect, database
		return &located
	}
	return &TableError{Table: s.table, Op: op, Dialect: dialect, Database: database, Err: err}
}

// databaseName is the name of the database the pool is in, "" when it
// cannot be read.
func (s *Store) databaseName(ctx context.Context) string {
	db, err := s.pool()
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	var name sql.NullString
	if err := db.QueryRowContext(ctx, s.q.databaseName).Scan(&name); err != nil {
		return ""
	}
	return name.String
}
