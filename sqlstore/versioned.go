package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// versioned is a table whose schema version is kept in its schema's
// [VersionTable]: the record table of a [Store], or the table of an
// [Inbox]. It holds what their Migrate and Verify share: the version row,
// the migration lock, running numbered migrations, and naming errors.
type versioned struct {
	dialect *Dialect
	// table is the name as configured, for errors; name is it parsed, for
	// the statements and the version row's key.
	table string
	name  tableName
	// kind is what the version row's completion column holds for the
	// table: the completion mode of a record table, "inbox" for an inbox.
	kind string
	// identityFrom is the schema version from which the table has an
	// identity: identityVersion for a record table, 1 for an inbox.
	identityFrom int
	vq           *versionQueries
}

// migrate brings the table to version target of its migrations, ms, as
// Store.MigrateTo and Inbox.Migrate ask. On a connection of its own that
// holds the migration lock of the table's schema, in one transaction that
// takes the in-transaction lock and makes sure the version table exists,
// it reads the table's version row and refuses a table of another kind or
// of a newer version, or one that check refuses (nil: none); it then runs
// the migrations the table lacks, rendered with data, gives the table an
// identity from version identityFrom on, and writes the row.
func (v *versioned) migrate(ctx context.Context, db *sqlx.DB, d *Dialect, ms []migration, target int, data templateData, check func(q executor) error) error {
	return v.withMigrationLock(ctx, db, d, func(conn *sqlx.Conn) error {
		tx, err := v.beginMigration(ctx, conn, d)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
		version, kind, err := v.readVersion(ctx, tx)
		if err != nil {
			return err
		}
		if version > 0 {
			if err := v.checkVersion("migrate", version, kind, len(ms), true); err != nil {
				return err
			}
			if check != nil {
				if err := check(tx); err != nil {
					return err
				}
			}
		}
		if version >= target && target < len(ms) {
			return tx.Commit() // at or past the version asked for
		}
		if err := v.runMigrations(ctx, tx, d, ms[version:target], data); err != nil {
			return err
		}
		identity, err := v.readIdentity(ctx, tx)
		if err != nil {
			return err
		}
		hasIdentity := identity != ""
		if !hasIdentity && target >= v.identityFrom {
			identity = newIdentity()
		}
		if version < target || identity != "" && !hasIdentity {
			if err := v.writeVersion(ctx, tx, version, target, identity); err != nil {
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			return v.fail("migrate", err)
		}
		return nil
	})
}

// verifyVersion checks, through q, that the table has a version row of its
// kind at version want, the version of this code's migrations.
func (v *versioned) verifyVersion(ctx context.Context, q executor, want int) error {
	version, kind, err := v.readVersion(ctx, q)
	if errors.Is(err, ErrTableMissing) {
		return &TableError{Table: v.table, Op: "verify", Err: ErrTableMissing}
	}
	if err != nil {
		return err
	}
	return v.checkVersion("verify", version, kind, want, false)
}

// checkVersion compares the table's version row (version 0: none) with
// want, the version of this code's migrations. A migration takes a missing
// or older table: it is what the migration is for.
func (v *versioned) checkVersion(op string, version int, kind string, want int, migrating bool) error {
	what, migrate := "table", "Store.Migrate"
	if v.kind == inboxKind {
		what, migrate = "inbox table", "Inbox.Migrate"
	}
	var err error
	switch {
	case version == 0 && migrating:
	case version == 0:
		err = ErrTableMissing
	case kind != v.kind && v.kind == inboxKind:
		err = fmt.Errorf("%w: not an inbox, its row in %s is a record table's (completion %q); give the inbox another name", ErrSchemaVersion, VersionTable, kind)
	case kind != v.kind:
		err = fmt.Errorf("%w: table was created for completion %q, store is configured for %q (set Config.Completion to the table's)", ErrSchemaVersion, kind, v.kind)
	case version > want:
		err = fmt.Errorf("%w: %s is at version %d, newer than this code's %d; upgrade the code", ErrSchemaVersion, what, version, want)
	case version < want && !migrating:
		err = fmt.Errorf("%w: %s is at version %d, this code needs %d; run %s", ErrSchemaVersion, what, version, want, migrate)
	}
	if err != nil {
		return &TableError{Table: v.table, Op: op, Err: err}
	}
	return nil
}

// withMigrationLock runs fn on a connection of its own that holds the
// migration lock of the table's schema, on the dialects that take it for
// the session (see Dialect.lockSession); the others lock inside the migration
// transaction (beginMigration).
func (v *versioned) withMigrationLock(ctx context.Context, db *sqlx.DB, d *Dialect, fn func(conn *sqlx.Conn) error) error {
	conn, err := db.Connx(ctx)
	if err != nil {
		return v.fail("migrate", err)
	}
	defer conn.Close()
	if d.lockSession != nil {
		if err := d.lockSession(ctx, conn, v.name.schema); err != nil {
			return v.fail("lock migrations", err)
		}
		defer func() {
			// The lock lives as long as the session: a connection that
			// cannot release it is discarded rather than pooled.
			if err := d.unlockSession(context.WithoutCancel(ctx), conn, v.name.schema); err != nil {
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}()
	}
	return fn(conn)
}

// beginMigration begins the migration transaction on conn, takes the
// dialect's in-transaction migration lock and makes sure the schema version
// table exists. The caller rolls the transaction back unless it commits.
func (v *versioned) beginMigration(ctx context.Context, conn *sqlx.Conn, d *Dialect) (migrationTx, error) {
	tx, err := beginTx(ctx, conn, d)
	if err != nil {
		return nil, v.fail("migrate", err)
	}
	if lock := v.vq.migrationLock; lock != "" {
		if _, err := tx.ExecContext(ctx, lock); err != nil {
			_ = tx.Rollback()
			return nil, v.fail("lock migrations", err)
		}
	}
	if err := v.prepareVersionTable(ctx, tx, d); err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	return tx, nil
}

// prepareVersionTable creates the schema version table, or adds the
// identity column to one created before identities existed. It runs under
// the migration lock, so two processes never add the column at once.
func (v *versioned) prepareVersionTable(ctx context.Context, tx executor, d *Dialect) error {
	if _, err := tx.ExecContext(ctx, v.vq.versionTableDDL); err != nil {
		return v.fail("create schema version table", err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, v.vq.versionIdentityColumn).Scan(&n); err != nil {
		return v.fail("read schema version table", err)
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, v.vq.addVersionIdentity); err != nil {
		if d.alreadyApplied != nil && d.alreadyApplied(v.vq.addVersionIdentity, err) {
			return nil
		}
		return v.fail("add identity to schema version table", err)
	}
	return nil
}

// runMigrations renders each migration with data and runs its statements
// through tx, in order.
func (v *versioned) runMigrations(ctx context.Context, tx executor, d *Dialect, ms []migration, data any) error {
	for _, m := range ms {
		var b strings.Builder
		if err := m.tmpl.Execute(&b, data); err != nil {
			return fmt.Errorf("sqlstore: render migration %s: %w", m.name, err)
		}
		for _, stmt := range statements(b.String()) {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				if d.alreadyApplied != nil && d.alreadyApplied(stmt, err) {
					continue
				}
				return v.fail("migration "+m.name, err)
			}
		}
	}
	return nil
}

// readVersion reads the table's row in the schema version table: version
// 0 when it has none, and what its completion column holds. A qualified
// table whose schema is missing gets an error wrapping [ErrSchemaMissing]
// rather than [ErrTableMissing], whose remedy (Migrate) would not help.
func (v *versioned) readVersion(ctx context.Context, q executor) (int, string, error) {
	var version int
	var kind string
	err := q.QueryRowContext(ctx, v.vq.readVersion, v.name.name).Scan(&version, &kind)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", nil
	}
	if err != nil {
		err = v.fail("read schema version", err)
		if errors.Is(err, ErrTableMissing) && v.name.schema != "" {
			return 0, "", v.schemaMissing(ctx, q, err)
		}
		return 0, "", err
	}
	return version, kind, nil
}

// schemaMissing returns an error wrapping [ErrSchemaMissing] when the
// table's schema does not exist, err otherwise.
func (v *versioned) schemaMissing(ctx context.Context, q executor, err error) error {
	var n int
	if qerr := q.QueryRowContext(ctx, v.vq.schemaExists, v.name.schema).Scan(&n); qerr != nil || n > 0 {
		return err
	}
	return &TableError{Table: v.table, Op: "read schema version", Err: ErrSchemaMissing}
}

// writeVersion records the version the table is at, and its identity ("" for
// none), in one statement: on MySQL, where the migration's DDL committed on
// its own, the version and the identity still appear together.
func (v *versioned) writeVersion(ctx context.Context, q executor, from, to int, identity string) error {
	id := sql.NullString{String: identity, Valid: identity != ""}
	var err error
	if from == 0 {
		_, err = q.ExecContext(ctx, v.vq.insertVersion, v.name.name, to, v.kind, id)
	} else {
		_, err = q.ExecContext(ctx, v.vq.updateVersion, to, id, v.name.name)
	}
	if err != nil {
		return v.fail("write schema version", err)
	}
	return nil
}

// locate makes an error of Migrate or Verify a [*TableError] that names
// the dialect and the database, read through db (nil when there is none).
// The database is asked for only once the failed call has given back its
// connections (a SQLite pool may have one), and briefly: an unreachable
// server leaves it unnamed.
func (v *versioned) locate(ctx context.Context, db *sqlx.DB, op string, err error) error {
	if err == nil {
		return nil
	}
	dialect, database := v.dialect.Name(), v.databaseName(ctx, db)
	if te, ok := err.(*TableError); ok { //nolint:errorlint // only the outermost error is completed; a wrapped one is wrapped
		located := *te
		located.Dialect, located.Database = dialect, database
		return &located
	}
	return &TableError{Table: v.table, Op: op, Dialect: dialect, Database: database, Err: err}
}

// databaseName is the name of the database db is in, "" when it cannot be
// read.
func (v *versioned) databaseName(ctx context.Context, db *sqlx.DB) string {
	if db == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	var name sql.NullString
	if err := db.QueryRowContext(ctx, v.vq.databaseName).Scan(&name); err != nil {
		return ""
	}
	return name.String
}
