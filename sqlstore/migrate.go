package sqlstore

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

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

// loadMigrations reads the numbered migrations in dir of fsys, in order:
// migrations/<dialect> for a record table, inboxMigrations for an inbox.
func loadMigrations(fsys fs.FS, dir string) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: no migrations in %s: %w", dir, err)
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
			return nil, fmt.Errorf("sqlstore: migrations in %s are not numbered 1..n (found %03d at position %d)", dir, m.version, i+1)
		}
	}
	return out, nil
}

// SchemaVersion is the version of the table schema this code expects for the
// dialect.
func SchemaVersion(d *Dialect) (int, error) {
	ms, err := loadMigrations(migrationFiles, recordMigrations(d))
	if err != nil {
		return 0, err
	}
	return len(ms), nil
}

// recordMigrations is the directory of a record table's migrations.
func recordMigrations(d *Dialect) string { return path.Join("migrations", d.Name()) }

// templateData is what migration templates see. Every name in it is a
// validated identifier, quoted by the dialect. Tables are qualified by the
// schema, if any; index and key names never are: an index lives in its
// table's schema (PostgreSQL refuses a qualified name in CREATE INDEX), or
// belongs to its table (MySQL).
type templateData struct {
	d     *Dialect
	table tableName
	Mark  bool
	// Partitioned is true for a table partitioned by id (PostgreSQL,
	// Config.PartitionEvery).
	Partitioned bool
}

// Sequence is the quoted, qualified sequence of a partitioned table's ids.
func (t templateData) Sequence() string { return t.table.in(t.d, sequenceName(t.table.name)) }

// FirstPartition is the partition a partitioned table is created with.
func (t templateData) FirstPartition() string { return t.table.in(t.d, partitionName(t.table.name, 0)) }

// FirstPartitionIndex names an index of the first partition.
func (t templateData) FirstPartitionIndex(suffix string) string {
	return t.d.quote(partitionName(t.table.name, 0) + "_" + suffix)
}

// PartitionSpan is the range of ids of one partition.
func (t templateData) PartitionSpan() int64 { return partitionSpan }

func (t templateData) Table() string { return t.table.quoted(t.d) }

func (t templateData) Index(suffix string) string { return t.d.quote(t.table.name + "_" + suffix) }

// QualifiedIndex is an index of the table by its name qualified with the
// table's schema, as DROP INDEX takes it.
func (t templateData) QualifiedIndex(suffix string) string {
	return t.table.in(t.d, t.table.name+"_"+suffix)
}

// ConsumersTable is the table of the per-consumer deliveries.
func (t templateData) ConsumersTable() string { return t.table.in(t.d, consumersTable(t.table.name)) }

// ConsumersIndex names an index or key of the consumers table, kept short
// so that it fits the identifier limit whatever the table (see
// validateTable).
func (t templateData) ConsumersIndex(suffix string) string {
	return t.d.quote(t.table.name + "_c_" + suffix)
}

// SeenTable is the table of the consumers seen per topic.
func (t templateData) SeenTable() string { return t.table.in(t.d, seenTable(t.table.name)) }

// SeenName is SeenTable unqualified, as ALTER TABLE … RENAME TO takes it.
func (t templateData) SeenName() string { return t.d.quote(seenTable(t.table.name)) }

// SeenIndex names a key of the seen table, kept short as ConsumersIndex
// is.
func (t templateData) SeenIndex(suffix string) string {
	return t.d.quote(t.table.name + "_s_" + suffix)
}

// ReceiversTable and ReceiversIndex are the seen table and its key as
// migration 6 creates them, before migration 10 (9 on MySQL) renames them.
func (t templateData) ReceiversTable() string {
	return t.table.in(t.d, t.table.name+receiversSuffix)
}

func (t templateData) ReceiversIndex(suffix string) string {
	return t.d.quote(t.table.name + "_r_" + suffix)
}

// DeclaredTable is the table of the consumers each topic's latest start
// declared.
func (t templateData) DeclaredTable() string { return t.table.in(t.d, declaredTable(t.table.name)) }

// DeclaredIndex names a key of the declarations table, kept short as
// ConsumersIndex is.
func (t templateData) DeclaredIndex(suffix string) string {
	return t.d.quote(t.table.name + "_d_" + suffix)
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
	ms, err := loadMigrations(s.migrations, recordMigrations(d))
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
	data := templateData{d: d, table: s.name, Mark: s.mode == Mark, Partitioned: s.partitionEvery > 0}
	return s.versioned.migrate(ctx, db, d, ms, target, data, func(q executor) error {
		return s.checkPartitioned(ctx, q, d, "migrate")
	})
}

// migrationTx is the migration's transaction: database/sql's, or one begun
// with the dialect's own statement on conn.
type migrationTx interface {
	executor
	Commit() error
	Rollback() error
}

// beginTx begins a migration's transaction on conn: with the dialect's own
// statement where it has one (SQLite's BEGIN IMMEDIATE, which queues for
// the write lock instead of failing with SQLITE_BUSY when it upgrades).
func beginTx(ctx context.Context, conn *sqlx.Conn, d *Dialect) (migrationTx, error) {
	if d.beginImmediate == "" {
		return conn.BeginTxx(ctx, nil)
	}
	if _, err := conn.ExecContext(ctx, d.beginImmediate); err != nil {
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
	ms, err := loadMigrations(s.migrations, recordMigrations(d))
	if err != nil {
		return err
	}
	if err := s.verifyVersion(ctx, db, len(ms)); err != nil {
		return err
	}
	if err := s.checkPartitioned(ctx, db, d, "verify"); err != nil {
		return err
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

// located is [versioned.locate] through the attached pool.
func (s *Store) located(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	db, _ := s.pool()
	return s.locate(ctx, db, op, err)
}
