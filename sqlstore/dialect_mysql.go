package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// MySQL is the dialect for MySQL 8 and MariaDB, for the
// github.com/go-sql-driver/mysql driver (driver name "mysql").
//
// The pool must be opened with interpolateParams=true in the DSN, so that a
// statement with arguments is one round trip rather than a prepare, an
// execute and a close, and with the utf8mb4 character set (the driver's
// default); the server must run in strict SQL mode (the default of MySQL 8
// and MariaDB), so that a value the table cannot hold is refused rather than
// truncated. For example:
//
//	user:password@tcp(127.0.0.1:3306)/app?interpolateParams=true
//
// The store checks this once per pool, at the first Insert, Migrate or Verify,
// where it also tells MariaDB from MySQL; a pool that does not qualify gets an
// error wrapping [ErrInvalidConfig] that names the setting.
//
// # Record ids of a batch
//
// A Publish of N messages is one INSERT of N rows, one round trip, and each
// message gets the id its row really got:
//
//   - MariaDB 10.5 and later: INSERT … RETURNING id returns the ids the rows
//     got, in the order they were inserted.
//   - MySQL (and older MariaDB) has no RETURNING. The OK packet of the INSERT
//     carries LAST_INSERT_ID(), the id of the first row, and the rows of one
//     multi-row INSERT … VALUES (a "simple insert" in InnoDB's terms: the
//     number of rows is known when the statement starts) get ids that step by
//     @@auto_increment_increment from it. InnoDB documents that for every
//     innodb_autoinc_lock_mode: under 0 ("traditional") and 1
//     ("consecutive", MariaDB's default) the numbers a statement is given are
//     consecutive, whatever else runs; under 2 ("interleaved", MySQL 8's
//     default) the manual promises no gaps within a statement "if the only
//     statements executing are simple inserts", because a simple insert
//     reserves its whole range at once, while a bulk insert (INSERT …
//     SELECT, LOAD DATA) takes values one by one and may interleave with it
//     (MySQL Reference Manual, "AUTO_INCREMENT Handling in InnoDB"; each
//     table has its own counter). The store only ever runs simple inserts,
//     so concurrent publishers are safe in every mode; under mode 2, do not
//     write the table with INSERT … SELECT, REPLACE … SELECT or LOAD DATA
//     while publishers run. The increment is read once per pool; no lock
//     mode calls for another mechanism, so the mode is not read.
//
// A batch larger than the server's max_allowed_packet is split into several
// INSERTs in one transaction.
//
// # Schema
//
// Timestamps are DATETIME(6) in UTC from UTC_TIMESTAMP(6), the database
// clock with microseconds: independent of the session time zone and free of
// TIMESTAMP's 2038 limit. Payloads are LONGBLOB, metadata JSON, topics
// VARBINARY(512) so that they compare byte for byte. DDL commits on its own
// in MySQL, so [Store.Migrate] serializes concurrent migrations with a named
// lock (GET_LOCK) rather than inside a transaction, and its migrations are
// written so that running one again after a failure is harmless.
func MySQL() *Dialect { return mysqlDialect(false) }

// mysqlDialect is the MySQL dialect; noReturning makes the probe choose the
// LAST_INSERT_ID() path even on a MariaDB that has RETURNING, so that tests
// can run it. The dialect inserts only once bound to a probed pool.
func mysqlDialect(noReturning bool) *Dialect {
	d := &Dialect{
		name:          "mysql",
		quoteMark:     "`",
		clock:         "UTC_TIMESTAMP(6)",
		leaseUntilSQL: "UTC_TIMESTAMP(6) + INTERVAL {arg} MICROSECOND",
		agoSQL:        "UTC_TIMESTAMP(6) - INTERVAL {arg} MICROSECOND",
		// SKIP LOCKED needs MySQL 8.0 or MariaDB 10.6.
		lockRowsSQL:   " FOR UPDATE",
		skipLockedSQL: " FOR UPDATE SKIP LOCKED",
		ageMicrosSQL:  "TIMESTAMPDIFF(MICROSECOND, {ts}, UTC_TIMESTAMP(6))",
		// No batchComplete: neither MySQL nor MariaDB has UPDATE …
		// RETURNING, so one statement could not tell each caller whether
		// its own record was pending, and a Complete call runs one
		// statement. The deliveries of a CompleteBatch complete together
		// in a transaction of two statements (lockedCompleteMany).
		completeMany: lockedCompleteMany,
		//
		// forceIndexSQL: MySQL and MariaDB have no partial indexes, so
		// every pending record of a marking table has processed_at NULL in
		// the processed index too, and the optimizer can read the page of
		// a replay as a ref on that NULL, walking every pending record
		// before the page's first id: 100 ms a page half way through a
		// million-record backlog, against about a millisecond through the
		// pending index (topic, processed_at, id).
		forceIndexSQL: " FORCE INDEX ({index})",
		// cleanTxOptions: at InnoDB's default REPEATABLE READ, the
		// cleaning's SELECT … FOR UPDATE locks the gaps of the
		// processed_at index it scans, where new records (processed_at
		// NULL) go: a concurrent insert waits for them, and InnoDB
		// resolves the deadlock with the cleaning's DELETE by cancelling
		// the insert. READ COMMITTED takes no gap locks.
		cleanTxOptions: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		// No lazyCommit: InnoDB's innodb_flush_log_at_trx_commit is
		// global, not per transaction, so every completion waits for the
		// disk as the server says. No deliveryPairs: no arrays. No
		// migrationLock: MySQL's DDL commits the transaction it runs in,
		// so a lock held by the transaction would not cover the
		// migration; see mysqlLockSession.
		versionTableDDLSQL: "CREATE TABLE IF NOT EXISTS {vt} (\n" +
			"    table_name VARCHAR(64) NOT NULL PRIMARY KEY,\n" +
			"    version INT NOT NULL,\n" +
			"    completion VARCHAR(16) NOT NULL,\n" +
			"    table_identity VARCHAR(64) NULL DEFAULT NULL\n" +
			") ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
		// versionIdentitySQL looks in the record table's database: the
		// connection's, or the schema of a qualified name.
		versionIdentitySQL: "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = {schema} AND table_name = '" + VersionTable + "' AND column_name = 'table_identity'",
		// addVersionIdentitySQL runs under the migration lock; a rerun
		// after a concurrent add is refused as a duplicate column, which
		// alreadyApplied accepts.
		addVersionIdentitySQL: "ALTER TABLE {vt} ADD COLUMN table_identity VARCHAR(64) NULL DEFAULT NULL",
		// A MySQL schema is a database.
		schemaExists:  "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?",
		databaseQuery: "SELECT DATABASE()",
		// No skipDuplicates: a duplicate key error (uniqueViolation) rolls
		// back only its statement in InnoDB, so the caller's transaction
		// stays usable, and the INSERT waits for an uncommitted
		// conflicting row's transaction before it reports one. INSERT
		// IGNORE would turn other errors into warnings too, and ON
		// DUPLICATE KEY UPDATE counts a skipped row as affected when the
		// DSN sets clientFoundRows.
		//
		// upsertSQL: ON DUPLICATE KEY UPDATE acts on a conflict with any
		// unique key, which is the one named on the tables it is used on
		// (their primary key).
		upsertSQL: " ON DUPLICATE KEY UPDATE {set}",
		// insertedSQL: VALUES(col), which MariaDB keeps and MySQL 8
		// still takes beside its row alias.
		insertedSQL: "VALUES({col})",
		// deleteOldestSQL: MySQL's single-table DELETE has ORDER BY and
		// LIMIT (and refuses a LIMIT in an IN subquery of its own table).
		deleteOldestSQL: "DELETE FROM {table} WHERE {cond} ORDER BY {order} LIMIT {limit}",
		// textColumn: utf8mb4 keeps valid UTF-8 (NUL included); a string
		// compared with one, in a WHERE, is not refused. nameColumn: the
		// VARBINARY(512) of topics and consumers keeps any bytes; the
		// inbox's VARBINARY(255) keys are bounded by MaxInboxField.
		textColumn: column{utf8: true},
		nameColumn: column{max: 512},

		leaseArg: func(lease time.Duration) any { return lease.Microseconds() },
		// Until the dialect is bound to a probed pool, it cannot insert:
		// the store binds it before every insert, so this is a bug.
		split: func(*insertStatements, []recordstore.Record, []string) ([]int, error) { return nil, errNotProbed },
		insert: func(context.Context, executor, *insertStatements, []recordstore.Record, []string) error {
			return errNotProbed
		},
		recordError:     mysqlRecordError,
		answered:        mysqlAnswered,
		convertError:    mysqlConvertError,
		invalidValue:    mysqlInvalidValue,
		uniqueViolation: mysqlUniqueViolation,
		lockSession:     mysqlLockSession,
		unlockSession:   mysqlUnlockSession,
		alreadyApplied:  mysqlAlreadyApplied,
	}
	d.probe = func(ctx context.Context, db *sqlx.DB) (*Dialect, error) {
		srv, err := probeMySQL(ctx, db, noReturning)
		if err != nil {
			return nil, err
		}
		bound := *d
		bound.server, bound.split, bound.insert = srv, srv.split, srv.insertRows
		return &bound, nil
	}
	return d
}

// mysqlServer is what the store needs to know about the server behind a pool.
type mysqlServer struct {
	version   string
	returning bool  // INSERT … RETURNING (MariaDB 10.5+)
	increment int64 // @@auto_increment_increment
	// maxStatement bounds the text of one INSERT, from max_allowed_packet.
	maxStatement int
}

// mysqlDriverMaxPacket is the driver's own limit on a packet when the DSN
// does not set maxAllowedPacket.
const mysqlDriverMaxPacket = 64 << 20

// mysqlTopic: the topic goes as bytes, since the column is VARBINARY,
// compared byte for byte.
func mysqlTopic(topic string) any { return []byte(topic) }

// probeMySQL learns, once per pool, which server this is and checks the
// settings the store relies on. It pins one connection so that the
// interpolation check sees the statements it runs.
func probeMySQL(ctx context.Context, db *sqlx.DB, noReturning bool) (*mysqlServer, error) {
	conn, err := db.Connx(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	prepares := func() (int64, error) {
		var name string
		var n int64
		err := conn.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_stmt_prepare'").Scan(&name, &n)
		return n, err
	}
	before, err := prepares()
	if err != nil {
		return nil, err
	}
	var (
		srv                                mysqlServer
		maxPacket                          int64
		csClient, csConn, csResults, modes string
		one                                int
	)
	// The trailing argument is how the interpolation check works: without
	// interpolateParams the driver prepares this statement on the server.
	err = conn.QueryRowContext(ctx, `SELECT VERSION(), @@auto_increment_increment, @@max_allowed_packet,
    @@character_set_client, @@character_set_connection, COALESCE(@@character_set_results, 'binary'), @@sql_mode, ?`, 1).
		Scan(&srv.version, &srv.increment, &maxPacket, &csClient, &csConn, &csResults, &modes, &one)
	if err != nil {
		return nil, err
	}
	after, err := prepares()
	if err != nil {
		return nil, err
	}
	switch {
	case after != before:
		return nil, fmt.Errorf("%w: the MySQL DSN must set interpolateParams=true, so that each statement is one round trip", ErrInvalidConfig)
	case csClient != "utf8mb4" || csConn != "utf8mb4" || (csResults != "utf8mb4" && csResults != "binary"):
		return nil, fmt.Errorf("%w: the MySQL connection must use the utf8mb4 character set (client %s, connection %s, results %s); leave charset unset in the DSN or set charset=utf8mb4",
			ErrInvalidConfig, csClient, csConn, csResults)
	case !strings.Contains(modes, "STRICT_TRANS_TABLES") && !strings.Contains(modes, "STRICT_ALL_TABLES"):
		return nil, fmt.Errorf("%w: the MySQL server must run in strict SQL mode (sql_mode %q), or values that do not fit would be truncated silently", ErrInvalidConfig, modes)
	case srv.increment < 1:
		return nil, fmt.Errorf("%w: unexpected auto_increment_increment %d", ErrInvalidConfig, srv.increment)
	}
	srv.returning = !noReturning && mariaDBHasReturning(srv.version)
	srv.maxStatement = int(min(maxPacket, mysqlDriverMaxPacket)) - 1024
	return &srv, nil
}

// mariaDBHasReturning reports whether VERSION() is a MariaDB of 10.5 or later,
// which has INSERT … RETURNING.
func mariaDBHasReturning(version string) bool {
	if !strings.Contains(version, "MariaDB") {
		return false
	}
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return err1 == nil && err2 == nil && (major > 10 || major == 10 && minor >= 5)
}

// errNotProbed is a MySQL dialect value used without the server it was
// bound to; the store binds it before every insert, so this is a bug.
var errNotProbed = errors.New("sqlstore: MySQL dialect used before its pool was probed")

// split returns the boundaries of the statements a batch needs: 0, then the
// end of each statement. A statement holds as many rows as fit in
// maxStatement once escaped. A row that cannot fit on its own is refused
// with ErrRecordTooLarge before anything is sent: the server would otherwise
// drop the connection, which the driver reports only as "invalid connection".
func (srv *mysqlServer) split(st *insertStatements, records []recordstore.Record, metadata []string) ([]int, error) {
	bounds := []int{0}
	base := len(st.values) + len(" RETURNING id")
	size := base
	for i, r := range records {
		row := escapedLen(r.Topic) + escapedLen(r.UUID) + escapedLen(r.Payload) + escapedLen(metadata[i]) + len(",(_binary'','','','')")
		if st.origin {
			row += escapedLen(r.Origin) + escapedLen(r.OrderKey) + len(",NULL,NULL")
		}
		if base+row > srv.maxStatement {
			return nil, fmt.Errorf("record #%d: %w: %d bytes once escaped, the server's max_allowed_packet allows %d per statement (raise it, or the DSN's maxAllowedPacket)",
				i, ErrRecordTooLarge, row, srv.maxStatement-base)
		}
		if size+row > srv.maxStatement && i > bounds[len(bounds)-1] {
			bounds = append(bounds, i)
			size = base
		}
		size += row
	}
	return append(bounds, len(records)), nil
}

// escapedLen is the length of a value as the driver interpolates it into a
// statement: backslash escaping adds one byte per special character (with
// NO_BACKSLASH_ESCAPES only quotes are doubled, which is never more).
func escapedLen[T string | []byte](v T) int {
	n := len(v)
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case 0, '\n', '\r', '\\', '\'', '"', 0x1a:
			n++
		}
	}
	return n
}

// insertRows saves records with one multi-row INSERT and sets their ids; see
// [MySQL] for why the ids are the rows' own.
func (srv *mysqlServer) insertRows(ctx context.Context, db executor, st *insertStatements, records []recordstore.Record, metadata []string) error {
	if srv.returning {
		text, args := valuesInsert(st, records, metadata, mysqlTopic, " RETURNING id")
		rows, err := db.QueryContext(ctx, text, args...)
		if err != nil {
			return err
		}
		return scanIDs(rows, records)
	}
	text, args := valuesInsert(st, records, metadata, mysqlTopic, "")
	res, err := db.ExecContext(ctx, text, args...)
	if err != nil {
		return err
	}
	first, err := res.LastInsertId()
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n != int64(len(records)) || first < 1 {
		return fmt.Errorf("insert of %d rows reported %d rows and first id %d", len(records), n, first)
	}
	for i := range records {
		records[i].ID = first + int64(i)*srv.increment
	}
	return nil
}

// mysqlMigrationLock names the lock that serializes migrations. GET_LOCK names
// are server-wide, so the name carries the database the tables are in: the
// connection's own, or the schema of a qualified table name, so that
// migrations of one database's tables serialize however they name them.
// Names are at most 64 characters, and a clash after truncation only
// serializes more.
const mysqlMigrationLock = "LEFT(CONCAT('watermill_outbox_migrate:', COALESCE(DATABASE(), '')), 64)"

// migrationLockName is mysqlMigrationLock for a schema, a validated
// identifier and so safe in a string literal.
func migrationLockName(schema string) string {
	if schema == "" {
		return mysqlMigrationLock
	}
	return "LEFT(CONCAT('watermill_outbox_migrate:', '" + schema + "'), 64)"
}

// mysqlLockSession takes the migration lock on the connection the migration runs
// on. It waits in short slices so that a cancelled context stops the wait
// within a second or so, while a long migration elsewhere is waited for.
func mysqlLockSession(ctx context.Context, conn *sqlx.Conn, schema string) error {
	lock := "SELECT GET_LOCK(" + migrationLockName(schema) + ", ?)"
	for {
		wait := 5 * time.Second
		if deadline, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(deadline))
		}
		var got sql.NullInt64
		secs := max(1, int(wait.Round(time.Second)/time.Second))
		if err := conn.QueryRowContext(ctx, lock, secs).Scan(&got); err != nil {
			return err
		}
		switch {
		case !got.Valid:
			return errors.New("GET_LOCK failed")
		case got.Int64 == 1:
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for another migration to finish: %w", err)
		}
	}
}

func mysqlUnlockSession(ctx context.Context, conn *sqlx.Conn, schema string) error {
	_, err := conn.ExecContext(ctx, "DO RELEASE_LOCK("+migrationLockName(schema)+")")
	return err
}

// Server error numbers, the same on MySQL and MariaDB.
const (
	mysqlBadDB             = 1049 // ER_BAD_DB_ERROR
	mysqlNoSuchTable       = 1146 // ER_NO_SUCH_TABLE
	mysqlNetPacketTooLarge = 1153 // ER_NET_PACKET_TOO_LARGE
)

// mysqlAnswered: a MySQLError is the server's answer; the driver returns
// driver.ErrBadConn only when it wrote nothing, and ErrPktTooLarge before it
// writes.
func mysqlAnswered(err error) bool {
	var myErr *mysqldriver.MySQLError
	return errors.As(err, &myErr) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysqldriver.ErrPktTooLarge)
}

func mysqlConvertError(err error) error {
	var myErr *mysqldriver.MySQLError
	switch {
	case errors.As(err, &myErr) && myErr.Number == mysqlNoSuchTable:
		return fmt.Errorf("%w: %w", ErrTableMissing, err)
	case errors.As(err, &myErr) && myErr.Number == mysqlBadDB:
		return fmt.Errorf("%w: %w", ErrSchemaMissing, err)
	case errors.As(err, &myErr) && myErr.Number == mysqlNetPacketTooLarge,
		errors.Is(err, mysqldriver.ErrPktTooLarge):
		return fmt.Errorf("%w (raise the server's max_allowed_packet, or the DSN's maxAllowedPacket): %w", ErrRecordTooLarge, err)
	case mysqlInvalidValue(err):
		return fmt.Errorf("%w: %w", recordstore.ErrInvalidValue, err)
	}
	return err
}

// mysqlInvalidValue: SQLSTATE class 22, data exception, which MySQL and
// MariaDB give, among others, an incorrect string value (1366, 22007), data
// too long (1406, 22001) and a value out of range (1264, 22003).
func mysqlInvalidValue(err error) bool {
	var myErr *mysqldriver.MySQLError
	return errors.As(err, &myErr) && myErr.SQLState[0] == '2' && myErr.SQLState[1] == '2'
}

// MySQL error numbers of DDL whose change is already there.
const (
	mysqlDupColumn   = 1060 // ER_DUP_FIELDNAME
	mysqlDupKeyName  = 1061 // ER_DUP_KEYNAME
	mysqlTableExists = 1050 // ER_TABLE_EXISTS_ERROR
)

// mysqlAlreadyApplied: MySQL 8 has no ADD COLUMN IF NOT EXISTS, ADD KEY IF
// NOT EXISTS nor RENAME TABLE IF EXISTS, so each ALTER of migration 002 and
// the RENAME TABLE of migration 009 is all or nothing on its own, and a
// rerun of one that was applied is refused: the column or key exists, or
// the table to rename is gone. A rerun from before migration 006, which
// creates the old table again, empty, finds the new name taken instead;
// the empty table stays.
func mysqlAlreadyApplied(stmt string, err error) bool {
	var myErr *mysqldriver.MySQLError
	if !errors.As(err, &myErr) {
		return false
	}
	switch myErr.Number {
	case mysqlDupColumn, mysqlDupKeyName:
		return true
	case mysqlNoSuchTable, mysqlTableExists:
		return strings.HasPrefix(stmt, "RENAME TABLE ")
	}
	return false
}

// mysqlRecordError reports the server refusing a row's data: a value too long or
// of the wrong kind, a NULL where none is allowed, a duplicate, a CHECK
// (MariaDB's JSON check) or a value out of range.
func mysqlRecordError(err error) bool {
	var myErr *mysqldriver.MySQLError
	if !errors.As(err, &myErr) {
		return false
	}
	switch myErr.Number {
	case 1048, 1062, 1264, 1366, 1406, 3140, 4025:
		return true
	}
	return false
}

// mysqlUniqueViolation: ER_DUP_ENTRY (1062) and ER_DUP_ENTRY_WITH_KEY_NAME (1586).
func mysqlUniqueViolation(err error) bool {
	var myErr *mysqldriver.MySQLError
	return errors.As(err, &myErr) && (myErr.Number == 1062 || myErr.Number == 1586)
}

// lockedMaxIDs is how many ids one lockedCompleteMany statement lists at
// most.
const lockedMaxIDs = 1000

// lockedCompleteMany is completeMany for a dialect without RETURNING, in
// one READ COMMITTED transaction (no gap locks, which would hold up
// inserts): the first statement locks the rows of ids that are pending,
// have no consumers and are of their delivery's message, skipping those
// another transaction holds (a CompleteTx still open), and the second
// completes exactly the rows it locked. So the batch never waits for
// another delivery's transaction, and it knows which ids it completed.
func lockedCompleteMany(ctx context.Context, d *Dialect, db executor, q *queries, consumer string, ids []int64, uuids []string) ([]int64, error) {
	pool, ok := db.(*sqlx.DB)
	if !ok {
		return nil, errors.New("sqlstore: a combined completion needs the pool")
	}
	tx, err := pool.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
	done := make([]int64, 0, len(ids))
	for start := 0; start < len(ids); start += lockedMaxIDs {
		end := min(start+lockedMaxIDs, len(ids))
		args := make([]any, 0, 3*(end-start))
		args, named := inListArgs(args, ids, uuids, start, end)
		rows, err := tx.QueryContext(ctx, inListQuery(d, q.lockIn, d.lockRows(true), 1, end-start, named), args...)
		if err != nil {
			return nil, err
		}
		locked, err := scanIDList(rows, nil)
		if err != nil {
			return nil, err
		}
		if len(locked) == 0 {
			continue
		}
		args = args[:0]
		for _, id := range locked {
			args = append(args, id)
		}
		if q.mark {
			args = append(args, consumer)
		}
		if _, err := tx.ExecContext(ctx, lockedWrite(q, len(locked)), args...); err != nil {
			return nil, err
		}
		done = append(done, locked...)
	}
	if len(done) == 0 {
		return done, nil
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return done, nil
}

// lockedWrite is q.writeIn for n ids: they are a derived table of
// constants, joined to the record table by its primary key. Listed in an
// IN instead, the ids of a small table are read by a scan, which waits for
// every row another transaction holds (a DELETE takes no semi-consistent
// read).
func lockedWrite(q *queries, n int) string {
	var b strings.Builder
	b.Grow(n * 20)
	for i := range n {
		if i == 0 {
			b.WriteString("SELECT ? AS id")
			continue
		}
		b.WriteString(" UNION ALL SELECT ?")
	}
	return fill(q.writeIn, "{ids}", b.String(), "{consumer}", "?")
}
