package sqlstore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/wmoutbox/outbox/recordstore"
)

var (
	// ErrInvalidTable is wrapped when a table name is neither a plain
	// identifier nor, on PostgreSQL and MySQL/MariaDB, two of them joined by
	// a dot (schema.table).
	ErrInvalidTable = errors.New("sqlstore: invalid table name")

	// ErrNoDB is returned by a store that has no database attached yet.
	ErrNoDB = errors.New("sqlstore: no database attached")

	// ErrTableMissing is wrapped when the store's table does not exist.
	ErrTableMissing = errors.New("sqlstore: table does not exist")

	// ErrSchemaMissing is wrapped when the schema of a schema-qualified
	// table (on MySQL/MariaDB, its database) does not exist. The store never
	// creates schemas: create it (CREATE SCHEMA, CREATE DATABASE), then run
	// [Store.Migrate].
	ErrSchemaMissing = errors.New("sqlstore: schema does not exist")

	// ErrSchemaVersion is wrapped when the table's schema version or
	// completion mode differs from what the code expects.
	ErrSchemaVersion = errors.New("sqlstore: table schema does not match")

	// ErrInvalidRecord is wrapped when a record cannot be stored as given,
	// e.g. metadata that is not valid UTF-8.
	ErrInvalidRecord = errors.New("sqlstore: invalid record")

	// ErrRecordTooLarge is wrapped when a record does not fit what the
	// database accepts in one statement (MySQL's max_allowed_packet). Nothing
	// was saved.
	ErrRecordTooLarge = errors.New("sqlstore: record too large for the database")

	// ErrRecordNotFound is wrapped when a record asked for by id does not
	// exist.
	ErrRecordNotFound = errors.New("sqlstore: record not found")

	// ErrInvalidEntry is wrapped when an [Inbox] is given an entry it
	// cannot keep: no Consumer or MessageUUID, a field longer than
	// [MaxInboxField], or one with bytes the database cannot keep. It is
	// recordstore.ErrInvalidEntry.
	ErrInvalidEntry = recordstore.ErrInvalidEntry

	// ErrInvalidConfig is wrapped by configuration errors. It is the
	// outbox's own sentinel (recordstore.ErrInvalidConfig, also
	// outbox.ErrInvalidConfig), so one errors.Is covers both packages.
	ErrInvalidConfig = recordstore.ErrInvalidConfig

	// ErrStatementPanicked is wrapped by the error of a call whose records
	// went in a combined statement that panicked (in the driver) on another
	// caller's goroutine, where the panic goes on.
	ErrStatementPanicked = errors.New("sqlstore: combined statement panicked")
)

// TableError names the table an error happened on. Errors of
// [Store.Migrate] and [Store.Verify] name the dialect and the database too,
// for the operator who has several.
type TableError struct {
	Table string
	Op    string
	// Dialect and Database are set by Migrate and Verify; Database is ""
	// when the server could not be asked, e.g. because it is unreachable.
	Dialect  string
	Database string
	Err      error
}

// Error implements error.
func (e *TableError) Error() string {
	where := ""
	switch {
	case e.Dialect != "" && e.Database != "":
		where = fmt.Sprintf(" (%s, database %s)", e.Dialect, e.Database)
	case e.Dialect != "":
		where = fmt.Sprintf(" (%s)", e.Dialect)
	}
	if schema, _, qualified := strings.Cut(e.Table, "."); qualified && errors.Is(e.Err, ErrSchemaMissing) {
		return fmt.Sprintf("sqlstore: %s on table %q%s: schema %q does not exist; create it first, the store never creates schemas: %v", e.Op, e.Table, where, schema, e.Err)
	}
	if errors.Is(e.Err, ErrTableMissing) {
		return fmt.Sprintf("sqlstore: %s on table %q%s: table does not exist; create it with Store.Migrate: %v", e.Op, e.Table, where, e.Err)
	}
	return fmt.Sprintf("sqlstore: %s on table %q%s: %v", e.Op, e.Table, where, e.Err)
}

// Unwrap returns the cause, for errors.Is and errors.As.
func (e *TableError) Unwrap() error { return e.Err }
