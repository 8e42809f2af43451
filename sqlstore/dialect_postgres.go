package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wmoutbox/outbox/recordstore"
)

// Postgres is the PostgreSQL dialect, for the pgx stdlib driver
// (import _ "github.com/jackc/pgx/v5/stdlib", driver name "pgx").
func Postgres() Dialect { return postgres{} }

type postgres struct{}

var _ Dialect = postgres{}

func (postgres) Name() string { return "postgres" }

func (postgres) quote(ident string) string { return `"` + strings.ReplaceAll(ident, `"`, `""`) + `"` }

func (postgres) placeholder(n int) string { return "$" + strconv.Itoa(n) }

func (postgres) clock() string { return "now()" }

// insertQuery inserts any number of rows with one statement of fixed text:
// the columns travel as four arrays. Rows are inserted in array order (ORDER
// BY ord), so the identity values they draw from the sequence increase in
// that order; RETURNING gives no order, hence the sort in insert.
// With origin, a fifth array carries the origins, "" for none (NULL in the
// table).
func (postgres) insertQuery(table string, origin bool) string {
	if origin {
		return fmt.Sprintf(`INSERT INTO %s (topic, uuid, payload, metadata, origin)
SELECT u.topic, u.uuid, u.payload, u.metadata::json, NULLIF(u.origin, '')
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[]) WITH ORDINALITY AS u(topic, uuid, payload, metadata, origin, ord)
ORDER BY u.ord
RETURNING id`, table)
	}
	return fmt.Sprintf(`INSERT INTO %s (topic, uuid, payload, metadata)
SELECT u.topic, u.uuid, u.payload, u.metadata::json
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]) WITH ORDINALITY AS u(topic, uuid, payload, metadata, ord)
ORDER BY u.ord
RETURNING id`, table)
}

// splitInsert: the arrays carry any number of rows in one statement.
func (postgres) splitInsert(_ *insertStatements, records []recordstore.Record, _ []string) ([]int, error) {
	return []int{0, len(records)}, nil
}

func (postgres) insert(ctx context.Context, db executor, st *insertStatements, records []recordstore.Record, metadata []string) error {
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
		for i, r := range records {
			origins[i] = r.Origin
		}
		args = append(args, origins)
	}
	rows, err := db.QueryContext(ctx, st.batch, args...)
	if err != nil {
		return err
	}
	return scanIDs(rows, records)
}

func (postgres) batchComplete(Completion) bool { return true }

// completeManyQuery passes the ids as one array, so the text is the same
// for any number of ids and the statement is prepared once per connection.
// Only records without consumers complete this way; a marking table
// records the consumer that completed them.
func (postgres) completeManyQuery(table string, mode Completion, lazy string) string {
	lazyJoin := ""
	if lazy != "" {
		lazyJoin = ", " + lazy
	}
	// The ids are joined as rows, not matched with id = ANY($1): with
	// ANY, the planner may scan the whole pending index (topic, id) for
	// them, a cost that grows with the backlog; joined, each id is one
	// primary key lookup. Each id comes with the UUID of its delivery's
	// message, the last argument, compared on the row found. A row another
	// transaction holds (a CompleteTx still open) is skipped, so that the
	// batch never waits for it: its call completes alone, outside the
	// batch.
	const sameMessage = "(u.uuid = '' OR l.uuid = u.uuid)"
	if mode == Mark {
		return fmt.Sprintf("UPDATE %s AS r SET processed_at = now(), completed_by = $2 FROM (SELECT l.id FROM %s AS l JOIN unnest($1::bigint[], $3::text[]) AS u(id, uuid) ON l.id = u.id WHERE %s AND l.processed_at IS NULL AND l.consumers = 0 FOR UPDATE OF l SKIP LOCKED) AS k%s WHERE r.id = k.id RETURNING r.id", table, table, sameMessage, lazyJoin)
	}
	return fmt.Sprintf("DELETE FROM %s AS r USING (SELECT l.id FROM %s AS l JOIN unnest($1::bigint[], $2::text[]) AS u(id, uuid) ON l.id = u.id WHERE %s AND l.consumers = 0 AND l.abandoned_at IS NULL FOR UPDATE OF l SKIP LOCKED) AS k%s WHERE r.id = k.id RETURNING r.id", table, table, sameMessage, lazyJoin)
}

func (postgres) deliveryPairs() string {
	return "unnest($1::bigint[], $2::text[]) AS x(id, consumer)"
}

// forceIndex: PostgreSQL's partial pending index holds only pending
// records, and no other index competes with it.
func (postgres) forceIndex(string) string { return "" }

// cleanTxOptions: READ COMMITTED, the default, takes no gap locks.
func (postgres) cleanTxOptions() *sql.TxOptions { return nil }

// lazyCommit sets synchronous_commit off for the statement's own
// transaction (set_config's third argument): its commit returns once the
// log is written, not flushed, and the WAL writer flushes it within a few
// hundred milliseconds. The setting is read when the transaction commits,
// after the statement ran.
func (postgres) lazyCommit() string {
	return "(SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit"
}

func (postgres) completeMany(ctx context.Context, db executor, q *queries, consumer string, ids []int64, uuids []string) ([]int64, error) {
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

// recordError: SQLSTATE class 22 is a data exception (a value the column
// refuses, such as a NUL byte in text), class 23 a violated constraint.
func (postgres) recordError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23"))
}

func (postgres) migrationLock() string {
	// One advisory lock key for all outbox migrations in the database.
	return "SELECT pg_advisory_xact_lock(7246981365)"
}

func (postgres) versionTableDDL(vt string) string {
	return `CREATE TABLE IF NOT EXISTS ` + vt + ` (
    table_name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    completion TEXT NOT NULL,
    table_identity TEXT
)`
}

// versionIdentityColumn finds the table as the statements do: in the
// record table's schema, or through the search path. The name is made of
// validated identifiers, so it is safe in the literal.
func (d postgres) versionIdentityColumn(t tableName) string {
	return `SELECT COUNT(*) FROM pg_attribute WHERE attrelid = to_regclass('` + t.versionTable(d) + `') AND attname = 'table_identity' AND NOT attisdropped`
}

func (postgres) addVersionIdentity(vt string) string {
	return `ALTER TABLE ` + vt + ` ADD COLUMN IF NOT EXISTS table_identity TEXT`
}

func (postgres) schemaExistsQuery() string {
	return "SELECT COUNT(*) FROM pg_namespace WHERE nspname = $1"
}

// answered: a PgError is the server's answer; SafeToRetry is pgx saying
// that nothing was sent.
func (postgres) answered(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || pgconn.SafeToRetry(err)
}

func (postgres) convertError(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return fmt.Errorf("%w: %w", ErrTableMissing, err)
	case errors.As(err, &pgErr) && pgErr.Code == "3F000": // invalid_schema_name
		return fmt.Errorf("%w: %w", ErrSchemaMissing, err)
	}
	return err
}

func (postgres) databaseQuery() string { return "SELECT current_database()" }

// leaseUntil: now() is the start of the statement's transaction, which for
// the claim, run on its own, is the statement's time.
func (postgres) leaseUntil(n int) string {
	return "now() + make_interval(secs => $" + strconv.Itoa(n) + "::float8)"
}

func (postgres) leaseArg(lease time.Duration) any { return lease.Seconds() }

func (postgres) ago(n int) string {
	return fmt.Sprintf("now() - ($%d::bigint * interval '1 microsecond')", n)
}

func (postgres) lockRows(skipLocked bool) string {
	if skipLocked {
		return " FOR UPDATE SKIP LOCKED"
	}
	return " FOR UPDATE"
}

func (postgres) ageMicros(ts string) string {
	return "CAST(EXTRACT(EPOCH FROM (now() - " + ts + ")) * 1000000 AS BIGINT)"
}

// insertsAloneBelow: measured on PostgreSQL, see Coalescing.InsertsAloneBelow.
func (postgres) insertsAloneBelow() int { return 4 }

// skipDuplicates: ON CONFLICT without a target covers every unique key, and
// waits for an uncommitted conflicting row's transaction to end. A plain
// INSERT's unique violation would abort the caller's transaction instead.
func (postgres) skipDuplicates() string { return " ON CONFLICT DO NOTHING" }

func (postgres) upsert(conflict, set string) string { return onConflictUpdate(conflict, set) }

// deleteOldest picks the rows in a subquery, since PostgreSQL's DELETE has
// no LIMIT, skipping those another delete holds, and deletes them by ctid:
// matched by key instead, the plan hash-joined the picked rows with a scan
// of the whole table. The picked rows are locked, so their ctid holds until
// the delete.
func (postgres) deleteOldest(table, cond, order, limit string) string {
	return fmt.Sprintf("DELETE FROM %s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %s WHERE %s ORDER BY %s LIMIT %s FOR UPDATE SKIP LOCKED))",
		table, table, cond, order, limit)
}

// uniqueViolation: SQLSTATE 23505, unique_violation.
func (postgres) uniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
