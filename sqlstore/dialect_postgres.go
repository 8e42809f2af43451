package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wmoutbox/outbox/recordstore"
)

// Postgres is the PostgreSQL dialect, for the pgx stdlib driver
// (import _ "github.com/jackc/pgx/v5/stdlib", driver name "pgx").
func Postgres() *Dialect { return &postgres }

var postgres = Dialect{
	name:      "postgres",
	quoteMark: `"`,
	numbered:  true,
	clock:     "now()",
	// leaseUntilSQL: now() is the start of the statement's transaction,
	// which for the claim, run on its own, is the statement's time.
	leaseUntilSQL: "now() + make_interval(secs => {arg}::float8)",
	agoSQL:        "now() - ({arg}::bigint * interval '1 microsecond')",
	lockRowsSQL:   " FOR UPDATE",
	skipLockedSQL: " FOR UPDATE SKIP LOCKED",
	ageMicrosSQL:  "CAST(EXTRACT(EPOCH FROM (now() - {ts})) * 1000000 AS BIGINT)",
	// The batch insert takes any number of rows with one statement of
	// fixed text: the columns travel as four arrays. Rows are inserted in
	// array order (ORDER BY ord), so the identity values they draw from
	// the sequence increase in that order; RETURNING gives no order, hence
	// the sort in scanIDs. With the origin, a fifth and a sixth array
	// carry the origins and the order keys, "" for none (NULL in the
	// table).
	insertBatchSQL: `INSERT INTO {table} (topic, uuid, payload, metadata)
SELECT u.topic, u.uuid, u.payload, u.metadata::json
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]) WITH ORDINALITY AS u(topic, uuid, payload, metadata, ord)
ORDER BY u.ord
RETURNING id`,
	//
	// Records with an order key first take a transaction-scoped advisory
	// lock per key (sorted, so that two inserts never wait for each
	// other in a circle), before their ids are drawn: inserts of one key
	// then commit in the order of their ids, so that a record never
	// becomes visible after a later record of its key was checked or run
	// without it. {seed} tells the table's keys from another table's.
	insertOriginBatchSQL: `INSERT INTO {table} (topic, uuid, payload, metadata, origin, order_key)
SELECT u.topic, u.uuid, u.payload, u.metadata::json, NULLIF(u.origin, ''), NULLIF(u.order_key, '')
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS u(topic, uuid, payload, metadata, origin, order_key, ord)
WHERE (SELECT COUNT(pg_advisory_xact_lock(h)) FROM (SELECT DISTINCT hashtextextended(k.topic || E'\x1f' || k.order_key, {seed}) AS h
    FROM unnest($1::text[], $6::text[]) AS k(topic, order_key) WHERE k.order_key <> '' ORDER BY 1) AS keys) >= 0
ORDER BY u.ord
RETURNING id`,
	insertOriginOneSQL: `INSERT INTO {table} (topic, uuid, payload, metadata, origin, order_key)
SELECT $1::text, $2::text, $3::bytea, $4::json, NULLIF($5::text, ''), NULLIF($6::text, '')
WHERE (SELECT COUNT(pg_advisory_xact_lock(hashtextextended($1::text || E'\x1f' || $6::text, {seed}))) WHERE $6::text <> '') >= 0
RETURNING id`,
	batchComplete: true,
	// The combined completion passes the ids as one array, so the text is
	// the same for any number of ids and the statement is prepared once
	// per connection. Only records without consumers complete this way; a
	// marking table records the consumer that completed them. Each id is
	// looked up on its own by its primary key (LATERAL … LIMIT 1), and
	// only the row found is tested: pending, no consumers, the UUID of its
	// delivery's message (the last argument). With the ids joined to the
	// table, or with the tests beside the lookup, the plan PostgreSQL
	// caches for the prepared statement while the table is small (a
	// generic plan, kept as the table grows) read the whole pending index
	// (topic, id), whose predicate the tests imply, or the whole table: a
	// cost that grows with every record the table ever held. Matched with
	// id = ANY($1), the planner may scan that index too.
	//
	// A row another transaction holds (a CompleteTx still open) is
	// skipped, so that the batch never waits for it: its call completes
	// alone, outside the batch. The lookup takes no lock to skip it (FOR
	// UPDATE SKIP LOCKED writes a lock record to the WAL for every row,
	// as large as the delete's own): it takes only rows that no
	// transaction has locked or written since they were saved or last
	// updated (xmax = 0; a lock, even one whose transaction ended, leaves
	// xmax set until the row is written again, and such a row completes
	// alone too). The rows found are written only at the ctid where they
	// were found: one that another transaction updates between the lookup
	// and the write is then a new version at another ctid, which the
	// write does not match, so its call completes alone as well. The id is
	// matched too: on a partitioned table each partition numbers its
	// ctids on its own.
	completeMarkSQL:      "UPDATE {table} AS r SET processed_at = now(), completed_by = $2 FROM (SELECT k.id, k.tid FROM unnest($1::bigint[], $3::text[]) AS u(id, uuid) CROSS JOIN LATERAL (SELECT l.id, l.ctid AS tid, l.uuid, l.consumers, l.processed_at FROM {table} AS l WHERE l.id = u.id AND l.xmax = 0 LIMIT 1) AS k WHERE (u.uuid = '' OR k.uuid = u.uuid) AND k.consumers = 0 AND k.processed_at IS NULL) AS k{lazy} WHERE r.id = k.id AND r.ctid = k.tid RETURNING r.id",
	completeDeleteSQL:    "DELETE FROM {table} AS r USING (SELECT k.id, k.tid FROM unnest($1::bigint[], $2::text[]) AS u(id, uuid) CROSS JOIN LATERAL (SELECT l.id, l.ctid AS tid, l.uuid, l.consumers, l.abandoned_at FROM {table} AS l WHERE l.id = u.id AND l.xmax = 0 LIMIT 1) AS k WHERE (u.uuid = '' OR k.uuid = u.uuid) AND k.consumers = 0 AND k.abandoned_at IS NULL) AS k{lazy} WHERE r.id = k.id AND r.ctid = k.tid RETURNING r.id",
	completeOneMarkSQL:   "UPDATE {table} AS r SET processed_at = now(), completed_by = $1{lazyFrom} WHERE r.id = $2 AND r.ctid = (SELECT l.tid FROM (SELECT ctid AS tid, uuid, consumers, processed_at FROM {table} WHERE id = $2 AND xmax = 0 LIMIT 1) AS l WHERE l.processed_at IS NULL AND l.consumers = 0 AND ($3 = '' OR l.uuid = $4))",
	completeOneDeleteSQL: "DELETE FROM {table} AS r{lazyUsing} WHERE r.id = $1 AND r.ctid = (SELECT l.tid FROM (SELECT ctid AS tid, uuid, consumers, abandoned_at FROM {table} WHERE id = $1 AND xmax = 0 LIMIT 1) AS l WHERE l.consumers = 0 AND l.abandoned_at IS NULL AND ($2 = '' OR l.uuid = $3))",
	deliveryPairs:        "unnest($1::bigint[], $2::text[]) AS x(id, consumer)",
	idArray:              "unnest({arg}::bigint[]) AS u(id)",
	keyArray:             "unnest({arg}::text[]) AS u(k)",
	// No forceIndexSQL: PostgreSQL's partial pending index holds only
	// pending records, and no other index competes with it. No
	// cleanTxOptions: READ COMMITTED, the default, takes no gap locks.

	// lazyCommit sets synchronous_commit off for the statement's own
	// transaction (set_config's third argument): its commit returns once
	// the log is written, not flushed, and the WAL writer flushes it
	// within a few hundred milliseconds. The setting is read when the
	// transaction commits, after the statement ran.
	lazyCommit: "(SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit",
	// One advisory lock key for all outbox migrations in the database.
	migrationLock:      "SELECT pg_advisory_xact_lock(7246981365)",
	versionTableDDLSQL: textVersionTableDDL,
	// versionIdentitySQL finds the table as the statements do: in the
	// record table's schema, or through the search path.
	versionIdentitySQL:    `SELECT COUNT(*) FROM pg_attribute WHERE attrelid = to_regclass('{vt}') AND attname = 'table_identity' AND NOT attisdropped`,
	addVersionIdentitySQL: `ALTER TABLE {vt} ADD COLUMN IF NOT EXISTS table_identity TEXT`,
	schemaExists:          "SELECT COUNT(*) FROM pg_namespace WHERE nspname = $1",
	databaseQuery:         "SELECT current_database()",
	// skipDuplicates: ON CONFLICT without a target covers every unique
	// key, and waits for an uncommitted conflicting row's transaction to
	// end. A plain INSERT's unique violation would abort the caller's
	// transaction instead.
	skipDuplicates: " ON CONFLICT DO NOTHING",
	upsertSQL:      onConflictUpdate,
	insertedSQL:    excludedColumn,
	// cleanSQL is one batch of the Cleaner, of {table} (the record table
	// or one of its partitions) and the delivery rows in {consumers}: one
	// statement, which commits without waiting for the disk (a cleaning a
	// crash loses is done again), picks the oldest completed rows that no
	// transaction holds (xmax = 0, as the completions do: another
	// cleaner's rows are being deleted, and skipped) and deletes them
	// where it found them, locking none first (FOR UPDATE would write a
	// lock record per row to the WAL beside its delete).
	cleanSQL: `WITH r AS (DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table}
    WHERE processed_at < now() - ($1::bigint * interval '1 microsecond') AND abandoned_at IS NULL AND xmax = 0 ORDER BY processed_at LIMIT $2))
  RETURNING id, consumers),
d AS (DELETE FROM {consumers} WHERE record_id IN (SELECT id FROM r WHERE consumers > 0))
SELECT COUNT(*) FROM r, (SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit`,
	// deleteOldestSQL picks the rows in a subquery, since PostgreSQL's
	// DELETE has no LIMIT, skipping those another delete holds, and
	// deletes them by ctid: matched by key instead, the plan hash-joined
	// the picked rows with a scan of the whole table. The picked rows are
	// locked, so their ctid holds until the delete.
	deleteOldestSQL: "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {cond} ORDER BY {order} LIMIT {limit} FOR UPDATE SKIP LOCKED))",
	// Text, whatever its column, is UTF-8 without NUL bytes: text holds
	// no NUL byte in any database, and a connection that speaks UTF-8 (in
	// a UTF8 database, the default) refuses invalid UTF-8. A database in
	// another encoding may refuse more, as a data exception.
	textColumn: pgText,
	nameColumn: pgText,

	leaseArg:        func(lease time.Duration) any { return lease.Seconds() },
	insert:          postgresInsert,
	completeMany:    postgresCompleteMany,
	recordError:     postgresRecordError,
	answered:        postgresAnswered,
	convertError:    postgresConvertError,
	invalidValue:    postgresInvalidValue,
	uniqueViolation: postgresUniqueViolation,
}

var pgText = column{utf8: true, noNUL: true}

// postgresInsert saves one record with a statement of fixed text, and a
// batch with the arrays of insertBatchSQL.
func postgresInsert(ctx context.Context, db executor, st *insertStatements, records []recordstore.Record, metadata []string) error {
	if len(records) == 1 {
		return insertSingle(ctx, db, st, &records[0], metadata[0])
	}
	topics := make([]string, len(records))
	uuids := make([]string, len(records))
	payloads := make([][]byte, len(records))
	for i, r := range records {
		topics[i], uuids[i], payloads[i] = r.Topic, r.UUID, payloadOf(r.Payload)
	}
	args := []any{topics, uuids, payloads, metadata}
	if st.origin {
		origins := make([]string, len(records))
		keys := make([]string, len(records))
		for i, r := range records {
			origins[i], keys[i] = r.Origin, r.OrderKey
		}
		args = append(args, origins, keys)
	}
	rows, err := db.QueryContext(ctx, st.batch, args...)
	if err != nil {
		return err
	}
	return scanIDs(rows, records)
}

func postgresCompleteMany(ctx context.Context, _ *Dialect, db executor, q *queries, consumer string, ids []int64, uuids []string) ([]int64, error) {
	args := []any{ids}
	if q.mark {
		args = append(args, consumer)
	}
	args = append(args, uuids)
	rows, err := db.QueryContext(ctx, q.completeMany, args...)
	if err != nil {
		return nil, err
	}
	return scanIDList(rows, make([]int64, 0, len(ids)))
}

// postgresRecordError: a data exception (postgresInvalidValue), or SQLSTATE
// class 23, a violated constraint.
func postgresRecordError(err error) bool {
	var pgErr *pgconn.PgError
	return postgresInvalidValue(err) || errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "23")
}

// postgresInvalidValue: SQLSTATE class 22, data exception: a value the
// server cannot take (a NUL byte in text, a character the database's
// encoding lacks, a number out of range).
func postgresInvalidValue(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// postgresAnswered: a PgError is the server's answer; SafeToRetry is pgx
// saying that nothing was sent.
func postgresAnswered(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || pgconn.SafeToRetry(err)
}

func postgresConvertError(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return fmt.Errorf("%w: %w", ErrTableMissing, err)
	case errors.As(err, &pgErr) && pgErr.Code == "3F000": // invalid_schema_name
		return fmt.Errorf("%w: %w", ErrSchemaMissing, err)
	case postgresInvalidValue(err):
		return fmt.Errorf("%w: %w", recordstore.ErrInvalidValue, err)
	}
	return err
}

// postgresUniqueViolation: SQLSTATE 23505, unique_violation.
func postgresUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
