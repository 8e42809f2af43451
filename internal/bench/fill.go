package main

import (
	"context"
	"fmt"
	"time"

	"github.com/wmoutbox/outbox/sqlstore"
)

// fillChunk is how many rows one fill statement writes: each chunk is its
// own transaction, so that ten million rows are not one transaction's undo
// log or one WAL burst.
const fillChunk = 250_000

// fillOlderThan is an age every completed record of a fill has passed
// (they were completed a day ago and more) and records completed while a
// case runs have not: a Cleaner with it deletes exactly the filled ones.
const fillOlderThan = 12 * time.Hour

// fillMetadata is the metadata of a generated record: the shape of the
// metadata the end-to-end cases publish.
const fillMetadata = `{"bench_publisher":"0","bench_sent":"1700000000000000000"}`

// fill says which records fillTable generates.
type fill struct {
	rows int
	// topics share the rows evenly, each a contiguous run of ids.
	topics []string
	// completed writes the rows as the store's Mark completion leaves a
	// record its handler completed: processed_at set, a day and more ago, one
	// millisecond apart in id order, and completed_by the handler's name,
	// which in the end-to-end cases is the topic. Otherwise the rows are
	// pending, as a publish leaves them.
	completed bool
}

// fillTable inserts f's records with set-based statements generated in the
// database (generate_series on PostgreSQL, the Sequence engine's seq tables
// on MariaDB, a recursive CTE on SQLite), a chunk at a time, then gathers the
// table's statistics, as autovacuum or an operator would have by the time a
// table is that large.
func fillTable(ctx context.Context, d *database, s *sqlstore.Store, f fill) error {
	if f.completed && s.Completion() != sqlstore.Mark {
		return fmt.Errorf("fill: completed records need a marking table, %s is %s", s.Table(), s.Completion())
	}
	if len(f.topics) == 0 || f.rows < 1 {
		return fmt.Errorf("fill: %d rows over %d topics", f.rows, len(f.topics))
	}
	per := f.rows / len(f.topics)
	first := 1
	for i, topic := range f.topics {
		last := first + per - 1
		if i == len(f.topics)-1 {
			last = f.rows
		}
		for lo := first; lo <= last; lo += fillChunk {
			hi := min(lo+fillChunk-1, last)
			query, args := fillStatement(d, s.Table(), f, topic, lo, hi)
			if _, err := d.db.ExecContext(ctx, query, args...); err != nil {
				return fmt.Errorf("fill %s rows %d to %d: %w", s.Table(), lo, hi, err)
			}
		}
		first = last + 1
	}
	if _, err := d.db.ExecContext(ctx, analyzeStatement(d, s.Table(), f.completed)); err != nil {
		return fmt.Errorf("fill: statistics of %s: %w", s.Table(), err)
	}
	return nil
}

// fillStatement is the statement that writes the rows lo to hi (numbered
// from 1 over the whole fill) of one topic, and its arguments. table is
// quoted by sqlstore; lo and hi are integers the program computed.
func fillStatement(d *database, table string, f fill, topic string, lo, hi int) (string, []any) {
	cols := "topic, uuid, payload, metadata"
	args := []any{topic, payload, fillMetadata, lo, hi}
	if f.completed {
		cols += ", created_at, processed_at, completed_by"
		// The last row of the whole fill is the most recently completed.
		args = append(args, f.rows)
	}
	switch d.name {
	case "postgres":
		vals := "$1::text, lpad(g::text, 36, '0'), $2::bytea, $3::json"
		if f.completed {
			at := "now() - interval '1 day' - ($6::bigint - g) * interval '1 millisecond'"
			vals += fmt.Sprintf(", %[1]s - interval '1 millisecond', %[1]s, $1::text", at)
		}
		return fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM generate_series($4::bigint, $5::bigint) AS g", table, cols, vals), args
	case "mariadb":
		// seq_<lo>_to_<hi> is a table of the Sequence engine, built in
		// since MariaDB 10.0: faster than a recursive CTE, and with no
		// recursion limit.
		from := fmt.Sprintf("seq_%d_to_%d", lo, hi)
		if !f.completed {
			return fmt.Sprintf("INSERT INTO %s (%s) SELECT ?, LPAD(seq, 36, '0'), ?, ? FROM %s", table, cols, from),
				[]any{topic, payload, fillMetadata}
		}
		return fmt.Sprintf(`INSERT INTO %s (%s)
SELECT ?, LPAD(seq, 36, '0'), ?, ?, at - INTERVAL 1000 MICROSECOND, at, ?
FROM (SELECT seq, UTC_TIMESTAMP(6) - INTERVAL 1 DAY - INTERVAL (? - seq) * 1000 MICROSECOND AS at FROM %s) AS g`, table, cols, from),
			[]any{topic, payload, fillMetadata, topic, f.rows}
	default:
		vals := "?1, printf('%036d', n), ?2, ?3"
		if f.completed {
			at := func(older string) string {
				return "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 day', '-' || ((?6 - n" + older + ") / 1000.0) || ' seconds')"
			}
			vals += ", " + at(" + 1") + ", " + at("") + ", ?1"
		}
		return fmt.Sprintf(`WITH RECURSIVE g(n) AS (SELECT ?4 UNION ALL SELECT n + 1 FROM g WHERE n < ?5)
INSERT INTO %s (%s) SELECT %s FROM g`, table, cols, vals), args
	}
}

// analyzeStatement gathers a table's statistics. A table that grew by
// millions of rows at once has none yet; the database would gather them
// shortly, a benchmark should not wait. For old rows (completed a day ago),
// PostgreSQL's VACUUM also sets the visibility map and hint bits, as
// autovacuum would have on such a table.
func analyzeStatement(d *database, table string, old bool) string {
	switch d.name {
	case "postgres":
		if old {
			return "VACUUM ANALYZE " + table
		}
		return "ANALYZE " + table
	case "mariadb":
		return "ANALYZE TABLE " + table
	}
	return "ANALYZE " + table
}
