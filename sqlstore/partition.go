package sqlstore

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// partitionSpan is the range of ids of one partition of a partitioned
// table (2^36, about 69 billion): partition k holds the ids from k×span to
// (k+1)×span, and starting partition k+1 moves the id sequence to its
// first id. Ids stay below 2^53 for 131,072 partitions, so that they are
// exact in JSON readers that hold numbers as doubles.
const partitionSpan int64 = 1 << 36

// sequenceName is the id sequence of a partitioned table.
func sequenceName(table string) string { return table + "_id_seq" }

// partitionName is partition k of a table.
func partitionName(table string, k int64) string { return table + "_p" + strconv.FormatInt(k, 10) }

// validatePartitions refuses a PartitionEvery that the table cannot have.
func (c Config) validatePartitions() error {
	switch {
	case c.PartitionEvery == 0:
		return nil
	case c.PartitionEvery < 0:
		return fmt.Errorf("%w: PartitionEvery %v is negative", ErrInvalidConfig, c.PartitionEvery)
	case c.Dialect.name != "postgres":
		return fmt.Errorf("%w: PartitionEvery needs PostgreSQL; %s tables are of one piece", ErrInvalidConfig, c.Dialect.name)
	case c.Completion != Mark:
		return fmt.Errorf("%w: PartitionEvery is for a marking table (Completion: Mark); a deleting table keeps no completed records to drop", ErrInvalidConfig)
	}
	return nil
}

// partition is one partition of a partitioned table, found by its name.
type partition struct {
	k int64
	// attached is false for a partition detached and not yet dropped: a
	// round cut short between the two.
	attached bool
	// detaching is true while a detach that was cut short is pending.
	detaching bool
}

// bounds is the partition's range of ids, as ATTACH PARTITION takes it.
func (p partition) bounds() string {
	from := "MINVALUE"
	if p.k > 0 {
		from = strconv.FormatInt(p.k*partitionSpan, 10)
	}
	return fmt.Sprintf("FOR VALUES FROM (%s) TO (%d)", from, (p.k+1)*partitionSpan)
}

// low is the partition's first id.
func (p partition) low() int64 {
	if p.k == 0 {
		return math.MinInt64
	}
	return p.k * partitionSpan
}

// Rotate starts the next partition of a partitioned table
// ([Config.PartitionEvery]) now: records saved from now on go to it, and
// the current one is dropped by the Cleaner once all its records were
// completed longer ago than the Cleaner's OlderThan. [Store.Clean] rotates
// by itself once the current partition's first record is older than
// PartitionEvery. Rotating takes no lock that the deliveries wait for: the
// new partition is created on its own, then attached (ATTACH PARTITION
// takes SHARE UPDATE EXCLUSIVE on the table), and the id sequence moved to
// its range. Several processes may rotate at once; one
// partition is started.
func (s *Store) Rotate(ctx context.Context) error {
	if s.partitionEvery == 0 {
		return fmt.Errorf("%w: table %q is not partitioned (Config.PartitionEvery)", ErrInvalidConfig, s.table)
	}
	db, _, err := s.bound(ctx)
	if err != nil {
		return err
	}
	return s.located(ctx, "rotate", s.withPartitionLock(ctx, db, func(conn *sqlx.Conn) error {
		return s.rotate(ctx, conn, true)
	}))
}

// withPartitionLock runs fn on a connection holding the advisory lock of
// the table's partitions, so that two processes never rotate or drop at
// once.
func (s *Store) withPartitionLock(ctx context.Context, db *sqlx.DB, fn func(conn *sqlx.Conn) error) error {
	conn, err := db.Connx(ctx)
	if err != nil {
		return s.fail("partitions", err)
	}
	defer conn.Close()
	key := "outbox partitions " + s.name.quoted(s.dialect)
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(hashtext($1))", key); err != nil {
		return s.fail("partitions", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext($1))", key) //nolint:errcheck // a failed unlock ends with the connection
	return fn(conn)
}

// currentPartition is the partition the id sequence gives ids in.
func (s *Store) currentPartition(ctx context.Context, conn *sqlx.Conn) (int64, error) {
	var last int64
	if err := conn.QueryRowContext(ctx, "SELECT last_value FROM "+s.name.in(s.dialect, sequenceName(s.name.name))).Scan(&last); err != nil {
		return 0, s.fail("partitions", err)
	}
	return max(last, 0) / partitionSpan, nil
}

// partitions lists the table's partitions by their names, attached or
// left detached by a round that was cut short, in order.
func (s *Store) partitions(ctx context.Context, conn *sqlx.Conn) ([]partition, error) {
	prefix := s.name.name + "_p"
	rows, err := conn.QueryContext(ctx, `SELECT c.relname, i.inhparent IS NOT NULL, COALESCE(i.inhdetachpending, false)
FROM pg_class c LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = $1::regclass
WHERE c.relkind = 'r' AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1::regclass) AND starts_with(c.relname, $2)`,
		s.name.quoted(s.dialect), prefix)
	if err != nil {
		return nil, s.fail("partitions", err)
	}
	defer rows.Close()
	var out []partition
	for rows.Next() {
		var name string
		var p partition
		if err := rows.Scan(&name, &p.attached, &p.detaching); err != nil {
			return nil, s.fail("partitions", err)
		}
		digits := strings.TrimPrefix(name, prefix)
		k, err := strconv.ParseInt(digits, 10, 64)
		if err != nil || k < 0 || strconv.FormatInt(k, 10) != digits {
			continue // another table whose name begins like a partition's
		}
		p.k = k
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("partitions", err)
	}
	slices.SortFunc(out, func(a, b partition) int { return int(a.k - b.k) })
	return out, nil
}

// rotate starts the partition after the current one: always when force is
// set, else when the current partition's first record is older than
// PartitionEvery. It completes a rotation that was cut short (a partition
// created but not attached, or attached with the sequence not moved).
func (s *Store) rotate(ctx context.Context, conn *sqlx.Conn, force bool) error {
	cur, err := s.currentPartition(ctx, conn)
	if err != nil {
		return err
	}
	parts, err := s.partitions(ctx, conn)
	if err != nil {
		return err
	}
	next := partition{k: cur + 1}
	if i := slices.IndexFunc(parts, func(p partition) bool { return p.k == next.k }); i >= 0 {
		next = parts[i]
	} else if !force {
		var due bool
		err := conn.QueryRowContext(ctx, "SELECT COALESCE((SELECT created_at < "+s.dialect.ago(1)+" FROM "+s.name.quoted(s.dialect)+" WHERE id >= $2 ORDER BY id LIMIT 1), false)",
			micros(s.partitionEvery), partition{k: cur}.low()).Scan(&due)
		if err != nil {
			return s.fail("rotate", err)
		}
		if !due {
			return nil
		}
	}
	name := s.name.in(s.dialect, partitionName(s.name.name, next.k))
	if !next.attached {
		stmts := []string{
			"CREATE TABLE IF NOT EXISTS " + name + " (LIKE " + s.name.quoted(s.dialect) + " INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
			"CREATE UNIQUE INDEX IF NOT EXISTS " + s.dialect.quote(partitionName(s.name.name, next.k)+"_origin") + " ON " + name + " (origin) WHERE origin IS NOT NULL",
			"ALTER TABLE " + s.name.quoted(s.dialect) + " ATTACH PARTITION " + name + " " + next.bounds(),
		}
		if err := s.execAll(ctx, conn, "rotate", stmts); err != nil {
			return err
		}
	}
	// The sequence moves forward only: under the lock no one else moves it,
	// and nextval only raises it.
	_, err = conn.ExecContext(ctx, "SELECT setval($1::regclass, $2, false) WHERE (SELECT last_value FROM "+s.name.in(s.dialect, sequenceName(s.name.name))+") < $2",
		s.name.in(s.dialect, sequenceName(s.name.name)), next.k*partitionSpan)
	if err != nil {
		return s.fail("rotate", err)
	}
	return nil
}

// execAll runs statements on conn, one after the other.
func (s *Store) execAll(ctx context.Context, conn *sqlx.Conn, op string, stmts []string) error {
	for _, stmt := range stmts {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return s.fail(op, err)
		}
	}
	return nil
}

// cleanPartitioned is Clean of a partitioned table: it rotates when the
// current partition is due, drops every earlier partition whose records
// were all completed longer ago than olderThan, and deletes one batch of
// old completed records, one by one, from the current partition or from
// an earlier one that a pending or abandoned record keeps. It returns the
// records deleted, and those dropped as the database estimates them.
func (s *Store) cleanPartitioned(ctx context.Context, db *sqlx.DB, d *Dialect, olderThan time.Duration, limit int) (int, error) {
	var dropped int
	var keep []int64 // partitions whose old completed records go one by one
	err := s.withPartitionLock(ctx, db, func(conn *sqlx.Conn) error {
		if err := s.rotate(ctx, conn, false); err != nil {
			return err
		}
		cur, err := s.currentPartition(ctx, conn)
		if err != nil {
			return err
		}
		parts, err := s.partitions(ctx, conn)
		if err != nil {
			return err
		}
		for _, p := range parts {
			if p.k >= cur {
				if p.k == cur {
					keep = append(keep, p.k)
				}
				continue
			}
			n, blocked, err := s.dropPartition(ctx, conn, p, olderThan)
			if err != nil {
				return err
			}
			dropped += n
			if blocked {
				keep = append(keep, p.k)
			}
		}
		return nil
	})
	if err != nil {
		return dropped, s.located(ctx, "clean", err)
	}
	for _, k := range keep {
		part := s.name.in(d, partitionName(s.name.name, k))
		n, err := s.cleanFrom(ctx, db, d, d.cleanQuery(part, s.q.consumers), cleanSelectFrom(part)+s.q.cleanWhere, olderThan, limit)
		if err != nil || n > 0 {
			return dropped + n, err
		}
	}
	return dropped, nil
}

// partitionState tells whether a partition holds a pending or abandoned
// record, and whether its last completion is older than olderThan (or it
// holds none). Each is read through the table's partial indexes.
func (s *Store) partitionState(ctx context.Context, conn *sqlx.Conn, table string, olderThan time.Duration) (blocked, old bool, err error) {
	err = conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+` WHERE processed_at IS NULL) OR EXISTS (SELECT 1 FROM `+table+` WHERE abandoned_at IS NOT NULL),
COALESCE((SELECT MAX(processed_at) FROM `+table+` WHERE processed_at IS NOT NULL AND abandoned_at IS NULL) < `+s.dialect.ago(1)+`, true)`,
		micros(olderThan)).Scan(&blocked, &old)
	if err != nil {
		return false, false, s.fail("clean", err)
	}
	return blocked, old, nil
}

// dropPartition drops an earlier partition whose records were all
// completed longer ago than olderThan, with their delivery rows, and
// returns how many records it held, as the database estimates it
// (pg_class.reltuples: exact after a VACUUM, close otherwise, 0 for a
// partition never vacuumed or analyzed); blocked is true when a pending or
// abandoned record keeps it. The partition is detached first with a lock
// the deliveries do not wait for (DETACH … CONCURRENTLY), which waits for
// every transaction that could still write to it, then checked again: a
// record whose insert committed after the first check is pending there,
// and the partition is attached again instead of dropped.
func (s *Store) dropPartition(ctx context.Context, conn *sqlx.Conn, p partition, olderThan time.Duration) (n int, blocked bool, err error) {
	table := s.name.in(s.dialect, partitionName(s.name.name, p.k))
	parent := s.name.quoted(s.dialect)
	blocked, old, err := s.partitionState(ctx, conn, table, olderThan)
	if err != nil {
		return 0, false, err
	}
	if blocked && (!p.attached || p.detaching) {
		// A round cut short after its detach left a record that committed
		// late outside the table: attach the partition again.
		var stmts []string
		if p.detaching {
			stmts = append(stmts, "ALTER TABLE "+parent+" DETACH PARTITION "+table+" FINALIZE")
		}
		stmts = append(stmts, "ALTER TABLE "+parent+" ATTACH PARTITION "+table+" "+p.bounds())
		return 0, true, s.execAll(ctx, conn, "clean", stmts)
	}
	if blocked || !old {
		return 0, blocked, nil
	}
	if err := s.deleteDeliveriesOf(ctx, conn, p); err != nil {
		return 0, false, err
	}
	switch {
	case p.detaching:
		err = s.execAll(ctx, conn, "clean", []string{"ALTER TABLE " + parent + " DETACH PARTITION " + table + " FINALIZE"})
	case p.attached:
		err = s.execAll(ctx, conn, "clean", []string{"ALTER TABLE " + parent + " DETACH PARTITION " + table + " CONCURRENTLY"})
	}
	if err != nil {
		return 0, false, err
	}
	if blocked, _, err = s.partitionState(ctx, conn, table, olderThan); err != nil {
		return 0, false, err
	}
	if blocked {
		return 0, true, s.execAll(ctx, conn, "clean", []string{"ALTER TABLE " + parent + " ATTACH PARTITION " + table + " " + p.bounds()})
	}
	// Counting the rows would read them all; the database's estimate,
	// kept by VACUUM and ANALYZE, costs nothing.
	var count float64
	if err := conn.QueryRowContext(ctx, "SELECT GREATEST(reltuples, 0) FROM pg_class WHERE oid = $1::regclass", table).Scan(&count); err != nil {
		return 0, false, s.fail("clean", err)
	}
	if err := s.execAll(ctx, conn, "clean", []string{"DROP TABLE " + table}); err != nil {
		return 0, false, err
	}
	return int(count), false, nil
}

// deleteDeliveriesOf deletes the delivery rows of a partition's records,
// in batches, before the partition goes: every one of them is complete.
func (s *Store) deleteDeliveriesOf(ctx context.Context, conn *sqlx.Conn, p partition) error {
	tc := s.name.in(s.dialect, consumersTable(s.name.name))
	for {
		res, err := conn.ExecContext(ctx, `DELETE FROM `+tc+` WHERE (record_id, consumer) IN
(SELECT record_id, consumer FROM `+tc+` WHERE record_id >= $1 AND record_id < $2 LIMIT 1000)`, p.low(), (p.k+1)*partitionSpan)
		if err != nil {
			return s.fail("clean", err)
		}
		if n, err := res.RowsAffected(); err != nil || n < 1000 {
			return err
		}
	}
}

// checkPartitioned refuses a store with PartitionEvery on an existing
// table of one piece, which cannot become partitioned. A store without it
// works on a partitioned table as on one of one piece.
func (s *Store) checkPartitioned(ctx context.Context, db executor, d *Dialect, op string) error {
	if d.name != "postgres" || s.partitionEvery == 0 {
		return nil
	}
	var partitioned bool
	err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass($1))", s.name.quoted(d)).Scan(&partitioned)
	if err != nil {
		return s.fail(op, err)
	}
	if !partitioned {
		return &TableError{Table: s.table, Op: op, Err: fmt.Errorf("%w: table is of one piece; Config.PartitionEvery needs a table created partitioned, under a new name", ErrSchemaVersion)}
	}
	return nil
}
