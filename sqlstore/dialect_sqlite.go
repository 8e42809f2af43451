package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// SQLite is the SQLite dialect, for the pure Go modernc.org/sqlite driver
// (import _ "modernc.org/sqlite", driver name "sqlite").
func SQLite() *Dialect { return &sqlite }

// sqliteMaxVars is SQLite's default limit of bound variables per statement.
const sqliteMaxVars = 32766

// sqliteMaxRows keeps a statement within SQLite's default limit of 32766
// bound variables (four per row, six with the origin and the order key); larger batches use
// several statements in one transaction.
const sqliteMaxRows = 8000

// sqliteClock has millisecond precision, the finest SQLite's clock gives,
// in UTC.
const sqliteClock = "strftime('%Y-%m-%d %H:%M:%f', 'now')"

var sqlite = Dialect{
	name:      "sqlite",
	quoteMark: `"`,
	clock:     sqliteClock,
	// leaseUntilSQL is in the clock's text format, so that it compares
	// with it.
	leaseUntilSQL: "strftime('%Y-%m-%d %H:%M:%f', 'now', {arg})",
	// agoSQL turns the microseconds into an SQLite time modifier ("-1.5
	// seconds").
	agoSQL: "strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ({arg} / 1000000.0) || ' seconds')",
	// No lockRowsSQL: SQLite locks the whole database for a writer, and
	// the operations that lock rows elsewhere are meant for a single node
	// here. No insertBatchSQL: a batch is one INSERT … VALUES built per
	// batch.
	ageMicrosSQL: "CAST((julianday('now') - julianday({ts})) * 86400000000 AS INTEGER)",
	// batchComplete: SQLite has UPDATE … RETURNING and DELETE …
	// RETURNING; the statement lists the ids (completeInQuery).
	batchComplete: true,
	// No forceIndexSQL: SQLite's partial pending index holds only pending
	// records. No cleanTxOptions: SQLite locks the whole database for a
	// write. No lazyCommit: SQLite's synchronous setting is per
	// connection, not per statement, so every completion waits for the
	// disk as the connection says. No deliveryPairs: no arrays.
	//
	// beginImmediate takes the database's write lock, waiting for it
	// within the busy timeout.
	beginImmediate: "BEGIN IMMEDIATE",
	// prepare: modernc.org/sqlite parses every statement it runs; the
	// ordered check spent more time in the parser than in the query.
	prepare:            true,
	versionTableDDLSQL: textVersionTableDDL,
	// versionIdentitySQL: SQLite table names are never qualified (see
	// schemaExists).
	versionIdentitySQL:    `SELECT COUNT(*) FROM pragma_table_info('` + VersionTable + `') WHERE name = 'table_identity'`,
	addVersionIdentitySQL: `ALTER TABLE {vt} ADD COLUMN table_identity TEXT`,
	// No schemaExists: SQLite's nearest thing to a schema is an attached
	// database, which lives only as long as the connection that attached
	// it, so a pool could not be relied on to have it. Table names are not
	// qualified.
	//
	// databaseQuery reads the file of the main database; "" in memory.
	databaseQuery: "SELECT file FROM pragma_database_list WHERE name = 'main'",
	// skipDuplicates: an upsert without a conflict target covers every
	// unique key. SQLite has one writer at a time, so there is no
	// uncommitted row of another transaction to wait for: the writer waits
	// for the write lock.
	skipDuplicates: " ON CONFLICT DO NOTHING",
	upsertSQL:      onConflictUpdate,
	insertedSQL:    excludedColumn,
	// deleteOldestSQL picks the rows by rowid, since the driver's SQLite is
	// built without DELETE … LIMIT.
	deleteOldestSQL: "DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {cond} ORDER BY {order} LIMIT {limit})",
	// No textColumn or nameColumn: SQLite's TEXT keeps any bytes.

	leaseArg:     func(lease time.Duration) any { return fmt.Sprintf("%+.3f seconds", lease.Seconds()) },
	split:        sqliteSplit,
	insert:       sqliteInsert,
	completeMany: sqliteCompleteMany,
	recordError:  sqliteRecordError,
	// answered is always true: SQLite runs in the process, and a statement
	// it interrupts, or a commit it could not make, is rolled back.
	answered:        func(error) bool { return true },
	convertError:    sqliteConvertError,
	invalidValue:    sqliteInvalidValue,
	uniqueViolation: sqliteUniqueViolation,
}

// sqliteSplit keeps each statement within SQLite's limit of bound
// variables.
func sqliteSplit(st *insertStatements, records []recordstore.Record, _ []string) ([]int, error) {
	rows := sqliteMaxRows
	if st.origin {
		rows = sqliteMaxRows * 4 / 6
	}
	bounds := make([]int, 0, 2+len(records)/rows)
	for start := 0; start < len(records); start += rows {
		bounds = append(bounds, start)
	}
	return append(bounds, len(records)), nil
}

func sqliteInsert(ctx context.Context, db executor, st *insertStatements, records []recordstore.Record, metadata []string) error {
	if len(records) == 1 {
		return insertSingle(ctx, db, st, &records[0], metadata[0])
	}
	// Rows of one statement get increasing rowids (AUTOINCREMENT), and
	// scanIDs assigns the returned ids in ascending order.
	text, args := valuesInsert(st, records, metadata, sqliteTopic, " RETURNING id")
	rows, err := db.QueryContext(ctx, text, args...)
	if err != nil {
		return err
	}
	return scanIDs(rows, records)
}

// sqliteTopic: the topic column is TEXT.
func sqliteTopic(topic string) any { return topic }

// completeMany binds each id once, and the id and UUID of each delivery
// that names its message once more (completeInQuery), so a statement takes
// at most three variables per id, and the consumer.
func sqliteCompleteMany(ctx context.Context, d *Dialect, db executor, q *queries, consumer string, ids []int64, uuids []string) ([]int64, error) {
	const perStatement = (sqliteMaxVars - 1) / 3
	done := make([]int64, 0, len(ids))
	for start := 0; start < len(ids); start += perStatement {
		end := min(start+perStatement, len(ids))
		args := make([]any, 0, 3*(end-start)+1)
		if q.mark {
			args = append(args, consumer)
		}
		first := len(args) + 1
		args, named := inListArgs(args, ids, uuids, start, end)
		rows, err := db.QueryContext(ctx, completeInQuery(d, q, first, end-start, named), args...)
		if err != nil {
			return nil, err
		}
		if done, err = scanIDList(rows, done); err != nil {
			return nil, err
		}
	}
	return done, nil
}

// sqliteCoder is what the driver's errors offer (modernc.org/sqlite.Error),
// without importing the driver into every program that uses sqlstore.
type sqliteCoder interface{ Code() int }

// sqliteRecordError: the primary result codes SQLITE_TOOBIG (18), SQLITE_CONSTRAINT
// (19, which includes RAISE(ABORT) in a trigger) and SQLITE_MISMATCH (20).
func sqliteRecordError(err error) bool {
	var c sqliteCoder
	if !errors.As(err, &c) {
		return false
	}
	switch c.Code() & 0xff {
	case 18, 19, 20:
		return true
	}
	return false
}

func sqliteConvertError(err error) error {
	switch {
	case err != nil && strings.Contains(err.Error(), "no such table"):
		return fmt.Errorf("%w: %w", ErrTableMissing, err)
	case sqliteInvalidValue(err):
		return fmt.Errorf("%w: %w", recordstore.ErrInvalidValue, err)
	}
	return err
}

// sqliteInvalidValue: the primary result codes SQLITE_TOOBIG (18), a string
// or blob longer than the database's limit, and SQLITE_MISMATCH (20).
func sqliteInvalidValue(err error) bool {
	var c sqliteCoder
	return errors.As(err, &c) && (c.Code()&0xff == 18 || c.Code()&0xff == 20)
}

// sqliteUniqueViolation: the extended result codes SQLITE_CONSTRAINT_PRIMARYKEY
// (1555) and SQLITE_CONSTRAINT_UNIQUE (2067).
func sqliteUniqueViolation(err error) bool {
	var c sqliteCoder
	return errors.As(err, &c) && (c.Code() == 1555 || c.Code() == 2067)
}
