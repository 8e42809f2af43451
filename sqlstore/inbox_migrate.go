package sqlstore

import (
	"context"
	"path"
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
	return in.versioned.migrate(ctx, in.db, d, ms, len(ms), templateData{d: d, table: in.name}, nil)
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
	return in.verifyVersion(ctx, in.db, want)
}
