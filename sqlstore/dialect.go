package sqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// Dialect is what differs between databases: identifier quoting,
// placeholders, the clock, row locking, the batch insert, the completion of
// many records at once, error codes and the schema. Use [Postgres],
// [MySQL] or [SQLite]; its other methods are unexported, so no other
// implementation exists.
type Dialect interface {
	// Name is the dialect's name, used in the schema version table and in
	// migration paths.
	Name() string

	// The fragments and fixed statements below are read once per store,
	// when its statements are built (see buildQueries).

	quote(ident string) string
	placeholder(n int) string
	clock() string
	// leaseUntil is the database clock plus the lease passed as the nth
	// argument, in the form leaseArg gives it.
	leaseUntil(n int) string
	// ago is the database clock minus the microseconds in placeholder n,
	// for the ages the operational queries (stale resubmit, cleaning)
	// compare with.
	ago(n int) string
	// lockRows is the row-locking clause of a SELECT in a transaction, ""
	// where the database locks more coarsely (SQLite).
	lockRows(skipLocked bool) string
	// ageMicros is the microseconds from the timestamp expression ts to
	// the database clock.
	ageMicros(ts string) string
	// insertQuery is the batch insert statement for the quoted table, when
	// the dialect has one of fixed text; "" when it builds one per batch.
	// With origin, the rows carry the origin column too.
	insertQuery(table string, origin bool) string
	// completeManyQuery is completeMany's statement for the quoted table,
	// when the dialect has one of fixed text; "" when it lists the ids.
	// lazy is lazyCommit's row source, or "" for a statement that waits
	// for the disk.
	completeManyQuery(table string, mode Completion, lazy string) string
	// deliveryPairs is a row source x(id, consumer) of the deliveries in
	// the arrays passed as arguments 1 (ids) and 2 (consumers); "" when
	// the dialect has no arrays, and checks run one by one.
	deliveryPairs() string
	// forceIndex is the clause, after a table name in FROM, that makes the
	// query use the named index of that table; "" where the planner needs
	// no such hint.
	forceIndex(index string) string
	// insertsAloneBelow is Coalescing.InsertsAloneBelow's default; 0 is
	// off.
	insertsAloneBelow() int
	// cleanTxOptions are the options of the cleaning's transaction; nil for
	// the defaults.
	cleanTxOptions() *sql.TxOptions
	// lazyCommit is a one-row source that, joined to a statement run on
	// its own, lets the statement's commit return before its log reaches
	// the disk; "" when the dialect has none.
	lazyCommit() string
	// migrationLock is run inside the migration transaction to serialize
	// concurrent migrations; "" when the database needs none.
	migrationLock() string
	// versionTableDDL creates the schema version table vt (quoted, in the
	// record table's schema) if it is missing.
	versionTableDDL(vt string) string
	// versionIdentityColumn counts the identity columns of the schema
	// version table of t (0 in one created before identities);
	// addVersionIdentity adds the column to vt.
	versionIdentityColumn(t tableName) string
	addVersionIdentity(vt string) string
	// schemaExistsQuery counts the schemas (MySQL: databases) named by its
	// one argument; "" when the database has no schemas (SQLite), whose
	// table names cannot be qualified.
	schemaExistsQuery() string
	// databaseQuery reads the name of the database a connection is in,
	// for errors that name it.
	databaseQuery() string
	// skipDuplicates ends an INSERT so that a row that conflicts with a
	// unique key of the table is skipped (no row affected), once the
	// transaction holding the conflicting row has ended, and the caller's
	// transaction stays usable; "" when the dialect reports the conflict as
	// an error that uniqueViolation recognizes and that leaves the
	// transaction usable too.
	skipDuplicates() string
	// upsert ends an INSERT so that a row whose key columns (conflict, a
	// column list) match a row of the table updates that row with set
	// instead.
	upsert(conflict, set string) string
	// deleteOldest deletes at most limit (a placeholder) rows of the
	// quoted table that match cond, those first whose order column is
	// lowest.
	deleteOldest(table, cond, order, limit string) string

	// The methods below run on every call.

	// leaseArg is a lease or a retry delay as the argument of leaseUntil.
	leaseArg(lease time.Duration) any
	// splitInsert returns the boundaries of the statements that save a
	// batch: 0, then the end of each statement. Most batches need one
	// statement; several run in one transaction (see Store.insertWith). A
	// record that fits no statement is refused here, before anything is
	// sent, with an error wrapping ErrRecordTooLarge.
	splitInsert(st *insertStatements, records []recordstore.Record, metadata []string) ([]int, error)
	// insert saves records, with their encoded metadata, in one statement
	// of st and sets their ids in order.
	insert(ctx context.Context, db executor, st *insertStatements, records []recordstore.Record, metadata []string) error
	// batchComplete reports whether completeMany exists for the mode. It
	// needs UPDATE … RETURNING (Mark) or DELETE … RETURNING (Delete), so that
	// each caller of a combined completion learns whether its own record was
	// pending; without it the store completes one id per statement.
	batchComplete(mode Completion) bool
	// completeMany completes the records without consumers of ids for the
	// consumer with one statement and returns the ids it completed, those
	// that were pending, in any order. ids are distinct; uuids[i] is the
	// message UUID of the delivery of ids[i], and a record whose delivery
	// names one ("" names none) completes only when it was saved with it.
	completeMany(ctx context.Context, db executor, q *queries, consumer string, ids []int64, uuids []string) ([]int64, error)
	// recordError reports whether err is the database refusing the data of
	// a row (a value, a constraint) rather than the connection or the
	// statement failing: a combined insert that fails so is retried call by
	// call, so that only the call whose record was refused fails.
	recordError(err error) bool
	// answered reports whether err is the database's own answer to the
	// statement (it refused it), or a failure before anything was sent,
	// so that the statement surely took no effect. Any other error (a lost
	// connection, a deadline while the statement or its commit was on its
	// way) leaves an insert's outcome unknown.
	answered(err error) bool
	// convertError turns a driver error into the package's sentinels.
	convertError(err error) error
	// uniqueViolation reports whether err is the database refusing a row
	// that duplicates a unique key: on the record table only a saved
	// Record.Origin, on an inbox an entry already handled.
	uniqueViolation(err error) bool
}

// The interfaces below are optional: only the MySQL dialect has these
// behaviours, and the store finds them by type assertion, so that the other
// dialects carry no methods that do nothing.

// immediateBeginner is implemented by dialects whose migration must take
// the write lock when its transaction begins (SQLite): a deferred
// transaction that read first cannot wait for another writer and fails
// with SQLITE_BUSY at once, so concurrent Migrates of several pools on one
// file would fail instead of queueing behind the busy timeout.
type immediateBeginner interface {
	beginImmediate() string
}

// serverProber is implemented by dialects that must look at the server
// behind a pool before they can insert: the MySQL dialect tells MariaDB from
// MySQL and checks the connection settings. The store probes once per
// attached pool and uses the dialect value the probe returns.
type serverProber interface {
	probe(ctx context.Context, db *sqlx.DB) (Dialect, error)
}

// sessionLocker is implemented by dialects whose DDL commits on its own
// (MySQL), where a lock taken inside the migration transaction would not
// cover the migration. Migrate holds the lock on its connection instead, from
// before the transaction to after it. The lock is the schema's: schema is
// the record table's, "" for the connection's own.
type sessionLocker interface {
	lockSession(ctx context.Context, conn *sqlx.Conn, schema string) error
	unlockSession(ctx context.Context, conn *sqlx.Conn, schema string) error
}

// rerunTolerant is implemented by dialects whose DDL commits on its own
// (MySQL): a migration cut short after its DDL and before its version was
// written runs again, and a statement refused because its column or index
// already exists has already done its work.
type rerunTolerant interface {
	alreadyApplied(err error) bool
}

// onConflictUpdate is the upsert of the dialects with INSERT … ON CONFLICT.
func onConflictUpdate(conflict, set string) string {
	return " ON CONFLICT (" + conflict + ") DO UPDATE SET " + set
}
