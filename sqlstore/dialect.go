package sqlstore

import (
	"context"
	"database/sql"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// Dialect is what differs between databases: a table of SQL fragments
// (identifier quoting, placeholders, the clock, row locking, the batch
// insert, the completion of many records at once, the schema), read once
// when a store builds its statements, and the few behaviours that differ
// (how a batch is inserted and split, how driver errors read). A database
// that lacks a fragment leaves it empty. Use [Postgres], [MySQL] or
// [SQLite]; its fields are unexported, so no other dialect exists.
type Dialect struct {
	name string

	// The fragments below are read once per store, when its statements
	// are built (see buildQueries). Those with holes name them in braces,
	// filled by the method of the same name without "SQL".

	// quoteMark quotes an identifier, doubled inside it.
	quoteMark string
	// numbered placeholders are $1, $2, …; the others are all ?.
	numbered bool
	clock    string
	// leaseUntilSQL is the database clock plus the lease passed as the
	// {arg} placeholder, in the form leaseArg gives it.
	leaseUntilSQL string
	// agoSQL is the database clock minus the microseconds in the {arg}
	// placeholder, for the ages the operational queries (stale resubmit,
	// cleaning) compare with.
	agoSQL string
	// lockRowsSQL and skipLockedSQL are the row-locking clauses of a
	// SELECT in a transaction, waiting for or skipping the rows another
	// transaction holds; "" where the database locks more coarsely
	// (SQLite).
	lockRowsSQL   string
	skipLockedSQL string
	// ageMicrosSQL is the microseconds from the timestamp expression {ts}
	// to the database clock.
	ageMicrosSQL string
	// insertBatchSQL and insertOriginBatchSQL are the batch insert of
	// fixed text for the quoted {table}, without and with the origin
	// column; "" when the dialect builds one per batch.
	insertBatchSQL       string
	insertOriginBatchSQL string
	// insertOriginOneSQL is the insert of one record with the origin
	// column, for the quoted {table}; "" for the plain INSERT … VALUES.
	insertOriginOneSQL string
	// batchComplete reports whether completeMany is one statement, which
	// concurrent Complete calls may share. It needs UPDATE … RETURNING
	// (Mark) or DELETE … RETURNING (Delete), so that each caller of a
	// combined completion learns whether its own record was pending;
	// without it a Complete call runs its own statement, and only a
	// CompleteBatch call's deliveries go through completeMany.
	batchComplete bool
	// completeMarkSQL and completeDeleteSQL are completeMany's statement
	// for the quoted {table}, when the dialect has one of fixed text; ""
	// when it lists the ids. {lazy} is ", " and lazyCommit's row source,
	// or "" for a statement that waits for the disk.
	completeMarkSQL   string
	completeDeleteSQL string
	// completeOneMarkSQL and completeOneDeleteSQL complete one record on
	// the coalesced path (with the arguments of Store.completeArgs),
	// never waiting for a row another transaction holds; "" when the
	// dialect has none, and such completions run as completeAlone.
	// {lazyFrom} and {lazyUsing} are " FROM " or " USING " and
	// lazyCommit's row source, or "".
	completeOneMarkSQL   string
	completeOneDeleteSQL string
	// idArray and keyArray are row sources u(id) and u(k) of the ids, or
	// the text keys, in the array argument {arg}; "" when the dialect has
	// no arrays, and statements list them one placeholder each.
	idArray  string
	keyArray string
	// deliveryPairs is a row source x(id, consumer) of the deliveries in
	// the arrays passed as arguments 1 (ids) and 2 (consumers); "" when
	// the dialect has no arrays, and checks run one by one.
	deliveryPairs string
	// forceIndexSQL is the clause, after a table name in FROM, that makes
	// the query use the quoted {index} of that table; "" where the planner
	// needs no such hint.
	forceIndexSQL string
	// cleanSQL is one batch of the cleaning in one statement, of {table}
	// and its delivery rows in {consumers}, with the age ($1, in
	// microseconds) and the limit ($2); it returns the records deleted.
	// "" when the dialect picks the records first, in a transaction.
	cleanSQL string
	// cleanTxOptions are the options of the cleaning's transaction; nil
	// for the defaults.
	cleanTxOptions *sql.TxOptions
	// lazyCommit is a one-row source that, joined to a statement run on
	// its own, lets the statement's commit return before its log reaches
	// the disk; "" when the dialect has none.
	lazyCommit string
	// migrationLock is run inside the migration transaction to serialize
	// concurrent migrations; "" when the database needs none.
	migrationLock string
	// beginImmediate begins a migration's transaction where it must take
	// the write lock at once (SQLite): a deferred transaction that read
	// first cannot wait for another writer and fails with SQLITE_BUSY at
	// once, so concurrent Migrates of several pools on one file would fail
	// instead of queueing behind the busy timeout. "" elsewhere.
	beginImmediate string
	// versionTableDDLSQL creates the schema version table {vt} (quoted, in
	// the record table's schema) if it is missing.
	versionTableDDLSQL string
	// versionIdentitySQL counts the identity columns of the schema version
	// table (0 in one created before identities): {vt} is its quoted name,
	// {schema} the record table's schema as an SQL expression.
	// addVersionIdentitySQL adds the column to {vt}.
	versionIdentitySQL    string
	addVersionIdentitySQL string
	// schemaExists counts the schemas (MySQL: databases) named by its one
	// argument; "" when the database has no schemas (SQLite), whose table
	// names cannot be qualified.
	schemaExists string
	// databaseQuery reads the name of the database a connection is in,
	// for errors that name it.
	databaseQuery string
	// skipDuplicates ends an INSERT so that a row that conflicts with a
	// unique key of the table is skipped (no row affected), once the
	// transaction holding the conflicting row has ended, and the caller's
	// transaction stays usable; "" when the dialect reports the conflict as
	// an error that uniqueViolation recognizes and that leaves the
	// transaction usable too.
	skipDuplicates string
	// upsertSQL ends an INSERT so that a row whose key columns ({conflict},
	// a column list) match a row of the table updates that row with {set}
	// instead.
	upsertSQL string
	// insertedSQL is, in an upsert's {set}, the value of column {col} in
	// the row the INSERT would have added.
	insertedSQL string
	// deleteOldestSQL deletes at most {limit} (a placeholder) rows of the
	// quoted {table} that match {cond}, those first whose {order} column
	// is lowest.
	deleteOldestSQL string
	// textColumn is what the columns of text keep (a record's uuid, an
	// inbox's source, an error text), nameColumn what those of names
	// compared byte for byte keep (topics, consumers, the inbox's keys);
	// see values.go.
	textColumn, nameColumn column

	// The behaviours below run on every call.

	// leaseArg is a lease or a retry delay as the argument of leaseUntil.
	leaseArg func(lease time.Duration) any
	// split returns the boundaries of the statements that save a batch:
	// 0, then the end of each statement; nil when one statement takes any
	// batch (see splitInsert).
	split func(st *insertStatements, records []recordstore.Record, metadata []string) ([]int, error)
	// insert saves records, with their encoded metadata, in one statement
	// of st and sets their ids in order.
	insert func(ctx context.Context, db executor, st *insertStatements, records []recordstore.Record, metadata []string) error
	// completeMany completes the records without consumers of ids for the
	// consumer (with one statement where batchComplete, in a transaction
	// of its own otherwise) and returns the ids it completed, those that
	// were pending, in any order; nil where neither can be done. ids are
	// distinct; uuids[i] is the message UUID of the delivery of ids[i],
	// and a record whose delivery names one ("" names none) completes only
	// when it was saved with it.
	completeMany func(ctx context.Context, d *Dialect, db executor, q *queries, consumer string, ids []int64, uuids []string) ([]int64, error)
	// recordError reports whether err is the database refusing the data
	// of a row (a value, a constraint) rather than the connection or the
	// statement failing: a combined insert that fails so is retried call
	// by call, so that only the call whose record was refused fails.
	recordError func(err error) bool
	// answered reports whether err is the database's own answer to the
	// statement (it refused it), or a failure before anything was sent,
	// so that the statement surely took no effect. Any other error (a
	// lost connection, a deadline while the statement or its commit was
	// on its way) leaves an insert's outcome unknown.
	answered func(err error) bool
	// convertError turns a driver error into the package's sentinels:
	// one that invalidValue recognizes into one wrapping
	// [recordstore.ErrInvalidValue].
	convertError func(err error) error
	// invalidValue reports whether err is the database refusing a value
	// as data it cannot keep or compare (a data exception), as opposed to
	// a statement or a connection failing.
	invalidValue func(err error) bool
	// uniqueViolation reports whether err is the database refusing a row
	// that duplicates a unique key: on the record table only a saved
	// Record.Origin, on an inbox an entry already handled.
	uniqueViolation func(err error) bool

	// prepare keeps the ordered topics' checks and put-backs prepared on
	// the pool (see stmtCache), for a driver that parses every statement
	// anew.
	prepare bool

	// The behaviours below are MySQL's alone; nil elsewhere.

	// probe looks at the server behind a pool before the store can
	// insert: the MySQL dialect tells MariaDB from MySQL and checks the
	// connection settings. The store probes once per attached pool and
	// uses the dialect the probe returns.
	probe func(ctx context.Context, db *sqlx.DB) (*Dialect, error)
	// server is what the probe learned, in the dialect it returns.
	server *mysqlServer
	// lockSession and unlockSession hold the migration lock on the
	// migration's connection, from before its transaction to after it,
	// where DDL commits on its own (MySQL) and a lock taken inside the
	// transaction would not cover the migration. The lock is the
	// schema's: schema is the record table's, "" for the connection's own.
	lockSession   func(ctx context.Context, conn *sqlx.Conn, schema string) error
	unlockSession func(ctx context.Context, conn *sqlx.Conn, schema string) error
	// alreadyApplied reports, where DDL commits on its own (MySQL), that
	// stmt, a statement of a migration run again after it was cut short
	// (after its DDL, before its version was written), was refused because
	// its column or index already exists, or its table was renamed: it has
	// already done its work.
	alreadyApplied func(stmt string, err error) bool
}

// Name is the dialect's name, used in the schema version table and in
// migration paths.
func (d *Dialect) Name() string { return d.name }

// fill puts values into the holes of a fragment: pairs of a hole's name,
// in braces, and its value.
func fill(fragment string, pairs ...string) string {
	return strings.NewReplacer(pairs...).Replace(fragment)
}

func (d *Dialect) quote(ident string) string {
	return d.quoteMark + strings.ReplaceAll(ident, d.quoteMark, d.quoteMark+d.quoteMark) + d.quoteMark
}

func (d *Dialect) placeholder(n int) string {
	if d.numbered {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

func (d *Dialect) leaseUntil(n int) string { return fill(d.leaseUntilSQL, "{arg}", d.placeholder(n)) }

func (d *Dialect) ago(n int) string { return fill(d.agoSQL, "{arg}", d.placeholder(n)) }

// agoFixed is ago with the window written into the statement as an
// integer of microseconds, for a window that never changes: PostgreSQL
// plans a parameter's window blind once it switches a long-lived
// connection's statement to a generic plan, and a constant keeps the plan
// that reads only the window.
func (d *Dialect) agoFixed(window time.Duration) string {
	return fill(d.agoSQL, "{arg}", strconv.FormatInt(window.Microseconds(), 10))
}

func (d *Dialect) lockRows(skipLocked bool) string {
	if skipLocked {
		return d.skipLockedSQL
	}
	return d.lockRowsSQL
}

func (d *Dialect) ageMicros(ts string) string { return fill(d.ageMicrosSQL, "{ts}", ts) }

func (d *Dialect) insertQuery(table, name string, origin bool) string {
	if origin {
		return fill(d.insertOriginBatchSQL, "{table}", table, "{seed}", tableSeed(name))
	}
	return fill(d.insertBatchSQL, "{table}", table)
}

// tableSeed is a number of the table's name, which tells its order keys'
// advisory locks from another table's (tables of one name in two schemas
// share it, and only wait for each other's inserts of a key).
func tableSeed(table string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(table))
	return strconv.FormatInt(int64(h.Sum64()), 10)
}

// completeQueries are completeMany's statement and the coalesced
// completion of one record, for the quoted table.
func (d *Dialect) completeQueries(table string, mode Completion, lazy string) (many, one string) {
	joined, lazyFrom, lazyUsing := "", "", ""
	if lazy != "" {
		joined, lazyFrom, lazyUsing = ", "+lazy, " FROM "+lazy, " USING "+lazy
	}
	many, one = d.completeDeleteSQL, d.completeOneDeleteSQL
	if mode == Mark {
		many, one = d.completeMarkSQL, d.completeOneMarkSQL
	}
	return fill(many, "{table}", table, "{lazy}", joined),
		fill(one, "{table}", table, "{lazyFrom}", lazyFrom, "{lazyUsing}", lazyUsing)
}

func (d *Dialect) forceIndex(index string) string {
	if d.forceIndexSQL == "" {
		return ""
	}
	return fill(d.forceIndexSQL, "{index}", d.quote(index))
}

func (d *Dialect) versionTableDDL(vt string) string { return fill(d.versionTableDDLSQL, "{vt}", vt) }

// versionIdentityColumn finds the version table as the statements do: in
// the record table's schema, or where the database finds an unqualified
// name. The names are validated identifiers, so they are safe in literals.
func (d *Dialect) versionIdentityColumn(t tableName) string {
	schema := "DATABASE()"
	if t.schema != "" {
		schema = "'" + t.schema + "'"
	}
	return fill(d.versionIdentitySQL, "{vt}", t.versionTable(d), "{schema}", schema)
}

func (d *Dialect) addVersionIdentity(vt string) string {
	return fill(d.addVersionIdentitySQL, "{vt}", vt)
}

func (d *Dialect) upsert(conflict, set string) string {
	return fill(d.upsertSQL, "{conflict}", conflict, "{set}", set)
}

func (d *Dialect) inserted(col string) string { return fill(d.insertedSQL, "{col}", col) }

// cleanQuery is cleanSQL for the quoted table and delivery table; ""
// without one.
func (d *Dialect) cleanQuery(table, consumers string) string {
	return fill(d.cleanSQL, "{table}", table, "{consumers}", consumers)
}

func (d *Dialect) deleteOldest(table, cond, order, limit string) string {
	return fill(d.deleteOldestSQL, "{table}", table, "{cond}", cond, "{order}", order, "{limit}", limit)
}

// splitInsert returns the boundaries of the statements that save a batch:
// 0, then the end of each statement. Most batches need one statement;
// several run in one transaction (see Store.insertRows). A record that
// fits no statement is refused here, before anything is sent, with an
// error wrapping ErrRecordTooLarge.
func (d *Dialect) splitInsert(st *insertStatements, records []recordstore.Record, metadata []string) ([]int, error) {
	if d.split == nil {
		return []int{0, len(records)}, nil
	}
	return d.split(st, records, metadata)
}

// textVersionTableDDL is the schema version table of the dialects with a
// TEXT type.
const textVersionTableDDL = `CREATE TABLE IF NOT EXISTS {vt} (
    table_name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    completion TEXT NOT NULL,
    table_identity TEXT
)`

// onConflictUpdate is the upsert of the dialects with INSERT … ON CONFLICT.
const onConflictUpdate = " ON CONFLICT ({conflict}) DO UPDATE SET {set}"

// excludedColumn is the inserted value of the dialects with INSERT … ON
// CONFLICT.
const excludedColumn = "excluded.{col}"
