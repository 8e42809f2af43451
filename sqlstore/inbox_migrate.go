package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"path"

	"github.com/jmoiron/sqlx"
)

// inboxMigrations is the directory of an inbox table's migrations, apart
// from the record table's: the two are numbered on their own.
func inboxMigrations(d *Dialect) string { return path.Join("migrations", "inbox", d.Name()) }

// InboxSchemaVersion is the version of the inbox table schema this code
// expects for the dialect.
func InboxSchemaVersion(d *Dialect) (int, error) {
	ms, err := loadMigrations(migrationFiles, inboxMigrations(d))
	if err != nil {
		return 0, err
	}
	return len(ms), nil
}

// Migrate creates the inbox table, or brings it to the current schema
// version, and records the version in the schema's [VersionTable] under the
// table's name. It is idempotent and safe to run from several processes at
// once on PostgreSQL and MySQL/MariaDB, under the lock [Store.Migrate]
// takes. A table of that name whose version row is a record table's is
// refused with an error wrapping [ErrSchemaVersion].
func (in *Inbox) Migrate(ctx context.Context) error {
	return in.locate(ctx, in.db, "migrate", in.migrate(ctx))
}

func (in *Inbox) migrate(ctx context.Context) error {
	d := in.dialect
	ms, err := loadMigrations(migrationFiles, inboxMigrations(d))
	if err != nil {
		return err
	}
	return in.withMigrationLock(ctx, in.db, d, func(conn *sqlx.Conn) error {
		tx, err := in.beginMigration(ctx, conn, d)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
		version, kind, err := in.readVersion(ctx, tx)
		if err != nil {
			return err
		}
		if version > 0 && kind != inboxKind || version > len(ms) {
			return in.checkVersion("migrate", version, kind, len(ms))
		}
		identity := ""
		if version > 0 {
			if identity, err = in.readIdentity(ctx, tx); err != nil {
				return err
			}
		}
		if version == len(ms) && identity != "" {
			return tx.Commit()
		}
		if err := in.runMigrations(ctx, tx, d, ms[version:], templateData{d: d, table: in.name}); err != nil {
			return err
		}
		if identity == "" {
			// The receiving service's identity in its confirmations.
			identity = newIdentity()
		}
		if err := in.writeVersion(ctx, tx, version, len(ms), identity); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return in.fail("migrate", err)
		}
		return nil
	})
}

// checkVersion compares the table's version row with the version this code
// has, want.
func (in *Inbox) checkVersion(op string, version int, kind string, want int) error {
	switch {
	case version == 0:
		return &TableError{Table: in.table, Op: op, Err: ErrTableMissing}
	case kind != inboxKind:
		return &TableError{Table: in.table, Op: op, Err: fmt.Errorf("%w: not an inbox, its row in %s is a record table's (completion %q); give the inbox another name", ErrSchemaVersion, VersionTable, kind)}
	case version < want:
		return &TableError{Table: in.table, Op: op, Err: fmt.Errorf("%w: inbox table is at version %d, this code needs %d; run Inbox.Migrate", ErrSchemaVersion, version, want)}
	case version > want:
		return &TableError{Table: in.table, Op: op, Err: fmt.Errorf("%w: inbox table is at version %d, newer than this code's %d; upgrade the code", ErrSchemaVersion, version, want)}
	}
	return nil
}

// Verify checks that the inbox table exists at the schema version this code
// expects. Its errors wrap [ErrTableMissing] or [ErrSchemaVersion] and say
// what to do.
func (in *Inbox) Verify(ctx context.Context) error {
	return in.locate(ctx, in.db, "verify", in.verify(ctx))
}

func (in *Inbox) verify(ctx context.Context) error {
	want, err := InboxSchemaVersion(in.dialect)
	if err != nil {
		return err
	}
	version, kind, err := in.readVersion(ctx, in.db)
	if errors.Is(err, ErrTableMissing) {
		return &TableError{Table: in.table, Op: "verify", Err: ErrTableMissing}
	}
	if err != nil {
		return err
	}
	return in.checkVersion("verify", version, kind, want)
}
