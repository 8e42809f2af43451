package sqlstore

// Ordered checks: a delivery of a topic with an ordering key
// (recordstore.Delivery.Ordered) reads, with the record's state and in the
// same statement, the earliest earlier record of its key that is not
// complete for the consumer. A delivery without Ordered runs the
// statements it always did.

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// orderQueries are the ordered twins of q.state and q.stateMany, one per
// policy: [0] an abandoned earlier record holds its key, [1] it does not
// (recordstore.Delivery.SkipAbandoned). repeatConsumer is set on dialects
// with positional placeholders, where the state statement binds the
// consumer twice.
type orderQueries struct {
	state          [2]string
	stateMany      [2]string
	repeatConsumer bool
	// claimKey claims the next record of a key (ClaimKey); putBack
	// moves a record's last send to dueLongAgo (PutBack).
	claimKey string
	putBack  string
	// heldKeys counts, per topic, the keys an abandoned record holds.
	heldKeys string
	// predecessors is Predecessors' statement, without its id list;
	// waitingKeys is WaitingKeys', without its key list. On a dialect
	// with arrays (Dialect.idArray) they take the ids, or the keys, as
	// one array instead (listed false): one statement text for any
	// number, looked up one by one by the primary key, or the order
	// index, whatever the table held when its plan was made.
	predecessors string
	waitingKeys  string
	listed       bool
	// predecessorMessages is PredecessorMessages' statement, one per
	// policy as state, without its id list.
	predecessorMessages [2]string
}

// heldBy is the column that names the earliest earlier record of r's topic
// and key not complete for consumer (an expression), as id*2, plus one when
// that record is abandoned for the consumer; NULL when none holds r. The
// order index (migration 007) holds exactly the rows this walks: those
// with a key that are pending or abandoned.
func (f fragments) heldBy(consumer string, skipAbandoned bool) string {
	notDone := ""
	if f.mark {
		// Abandoning marks a record processed too.
		notDone = " AND (e.processed_at IS NULL OR e.abandoned_at IS NOT NULL)"
	}
	skip := ""
	if skipAbandoned {
		skip = " AND e.abandoned_at IS NULL AND ec.abandoned_at IS NULL"
	}
	return fmt.Sprintf(`(SELECT e.id * 2 + CASE WHEN (e.consumers = 0 AND e.abandoned_at IS NOT NULL) OR ec.abandoned_at IS NOT NULL THEN 1 ELSE 0 END
    FROM %s e%s LEFT JOIN %s ec ON ec.record_id = e.id AND ec.consumer = %s
    WHERE e.topic = r.topic AND e.order_key = r.order_key AND e.id < r.id%s
      AND (e.consumers = 0 OR (ec.record_id IS NULL AND e.%s) OR ec.processed_at IS NULL)%s
    ORDER BY e.id LIMIT 1)`, f.t, f.orderIndex(), f.tc, consumer, notDone, f.pending, skip)
}

// headOfKey is true for a record r without an order key, or with no
// earlier pending record of its key: the stale resubmitter sends only the
// heads of keys again, since a later record would only be held and put
// back; the completion of the head sends the next (ClaimKey).
func (f fragments) headOfKey() string {
	return fmt.Sprintf("(r.order_key IS NULL OR NOT EXISTS (SELECT 1 FROM %s e%s WHERE e.topic = r.topic AND e.order_key = r.order_key AND e.id < r.id AND e.%s))", f.t, f.orderIndex(), f.pending)
}

// orderIndex is the hint, after the alias of the record table in FROM,
// that makes MySQL/MariaDB walk the order index (migration 007) for the
// records of one key: left to itself, MariaDB walked the primary key from
// r.id, reading every record of the table in between (180 rows per
// message with 1,000 keys in turn). Empty on the other dialects.
func (f fragments) orderIndex() string { return f.d.forceIndex(f.table.name + "_order") }

// buildOrder builds the ordered check statements from the state columns
// of buildCheck.
func (q *queries) buildOrder(f fragments, columns string) {
	q.order.repeatConsumer = f.p(1) == f.p(2)
	q.buildClaimKey(f)
	for i, skip := range []bool{false, true} {
		q.order.state[i] = fmt.Sprintf(`SELECT %s, %s
FROM %s r LEFT JOIN %s c ON c.record_id = r.id AND c.consumer = %s
WHERE r.id = %s`, columns, f.heldBy(f.p(1), skip), f.t, f.tc, f.p(1), f.p(2))
		if pairs := f.d.deliveryPairs; pairs != "" {
			q.order.stateMany[i] = fmt.Sprintf(`SELECT x.id, x.consumer, s.*
FROM %s CROSS JOIN LATERAL (SELECT %s, %s
FROM %s r LEFT JOIN %s c ON c.record_id = r.id AND c.consumer = x.consumer
WHERE r.id = x.id LIMIT 1) AS s`, pairs, columns, f.heldBy("x.consumer", skip), f.t, f.tc)
		}
	}
}

// policy indexes orderQueries by d's policy.
func policy(d recordstore.Delivery) int {
	if d.SkipAbandoned {
		return 1
	}
	return 0
}

// orderedStateQuery is the statement and the arguments that read an
// ordered delivery's state.
func (s *Store) orderedStateQuery(d recordstore.Delivery) (string, []any) {
	if s.q.order.repeatConsumer {
		return s.q.order.state[policy(d)], []any{d.Consumer, d.Consumer, d.ID}
	}
	return s.q.order.state[policy(d)], []any{d.Consumer, d.ID}
}

// held is decide's verdict on the earlier record the ordered state read:
// nil when none holds the record.
func held(id int64, by sql.NullInt64) error {
	if !by.Valid {
		return nil
	}
	return &recordstore.HeldError{ID: id, Before: by.Int64 / 2, Abandoned: by.Int64%2 == 1}
}

var _ recordstore.KeyClaimer = (*Store)(nil)

// buildClaimKey builds ClaimKey's statement: claimStale's, of the first
// pending record of one key, on the order index.
func (q *queries) buildClaimKey(f fragments) {
	t, tc, p, d := f.t, f.tc, f.p, f.d
	q.order.heldKeys = fmt.Sprintf(`SELECT a.topic, COUNT(DISTINCT a.order_key) FROM %s a
WHERE a.abandoned_at IS NOT NULL AND a.order_key IS NOT NULL
  AND EXISTS (SELECT 1 FROM %s p WHERE p.topic = a.topic AND p.order_key = a.order_key AND p.id > a.id AND p.%s)
GROUP BY a.topic`, t, t, f.pending)
	notDone := func(alias string) string {
		if !f.mark {
			return ""
		}
		return fmt.Sprintf(" AND (%s.processed_at IS NULL OR %s.abandoned_at IS NOT NULL)", alias, alias)
	}
	// The records by their primary key alone, so that no plan walks the
	// order index for them; each one's latest earlier record of its key
	// that the order index holds (not complete), or -1 for a record to
	// leave out.
	ordered := fmt.Sprintf("r.topic = %s AND r.order_key IS NOT NULL%s", p(1), notDone("r"))
	order := f.orderIndex()
	earlier := func(col, cond string) string {
		return fmt.Sprintf("(SELECT e.%s FROM %s e%s WHERE e.topic = r.topic AND e.order_key = r.order_key AND e.id < r.id%s ORDER BY e.id DESC LIMIT 1)", col, t, order, cond)
	}
	latest := fmt.Sprintf("CASE WHEN %s\n    THEN COALESCE(%s, 0)\n    ELSE -1 END", ordered, earlier("id", notDone("e")))
	// PredecessorMessages' earlier record, per policy: not complete, or
	// (skipping abandoned records) pending.
	conds := [2]string{notDone("e"), " AND e." + f.pending}
	waiting := fmt.Sprintf("topic = %s AND %s AND COALESCE(last_sent_at, created_at) < %s", p(1), f.pending, d.ago(2))
	if ids := d.idArray; ids != "" {
		from := fmt.Sprintf("%s CROSS JOIN LATERAL (SELECT * FROM %s WHERE id = u.id LIMIT 1) AS r", fill(ids, "{arg}", p(2)), t)
		q.order.predecessors = fmt.Sprintf("SELECT u.id, %s\nFROM %s", latest, from)
		for i, cond := range conds {
			// One walk of the order index for the id and the UUID.
			q.order.predecessorMessages[i] = fmt.Sprintf(`SELECT u.id, CASE WHEN %s THEN COALESCE(e.id, 0) ELSE -1 END, e.uuid
FROM %s
LEFT JOIN LATERAL (SELECT e.id, e.uuid FROM %s e WHERE e.topic = r.topic AND e.order_key = r.order_key AND e.id < r.id%s ORDER BY e.id DESC LIMIT 1) AS e ON TRUE`,
				ordered, from, t, cond)
		}
		q.order.waitingKeys = fmt.Sprintf(`SELECT u.k FROM %s CROSS JOIN LATERAL (SELECT 1 FROM %s WHERE order_key = u.k AND %s LIMIT 1) AS w`, fill(d.keyArray, "{arg}", p(3)), t, waiting)
	} else {
		q.order.listed = true
		q.order.predecessors = fmt.Sprintf("SELECT r.id, %s\nFROM %s r WHERE r.id IN ", latest, t)
		for i, cond := range conds {
			q.order.predecessorMessages[i] = fmt.Sprintf("SELECT r.id, CASE WHEN %s\n    THEN COALESCE(%s, 0)\n    ELSE -1 END, %s\nFROM %s r WHERE r.id IN ",
				ordered, earlier("id", cond), earlier("uuid", cond), t)
		}
		q.order.waitingKeys = fmt.Sprintf("SELECT DISTINCT order_key FROM %s\nWHERE %s AND order_key IN ", t, waiting)
	}
	q.order.putBack = fmt.Sprintf("UPDATE %s SET last_sent_at = %s WHERE id = %s AND topic = %s AND %s", t, p(1), p(2), p(3), f.pending)
	// Only the head of the key after afterID is claimed: a later record
	// would only be held and put back again, and a head another claim
	// holds (SKIP LOCKED) is sent by that claim.
	q.order.claimKey = fmt.Sprintf(`SELECT id, topic, uuid, payload, metadata FROM %s r
WHERE id = (SELECT MIN(h.id) FROM %s h%s WHERE h.topic = %s AND h.order_key = %s AND h.id > %s AND h.%s)
  AND COALESCE(last_sent_at, created_at) < %s
  AND ((consumers = 0 AND %s) OR (consumers > 0 AND EXISTS (SELECT 1 FROM %s c WHERE c.record_id = r.id AND %s AND %s)))%s`,
		t, t, f.orderIndex(), p(1), p(2), p(3), f.pending, d.ago(4), f.due("due_at"), tc, cPending, f.due("c.due_at"), d.lockRows(true))
}

// ClaimKey implements [recordstore.KeyClaimer] as ClaimStale does, in one
// transaction.
func (s *Store) ClaimKey(ctx context.Context, topic, key string, afterID int64, olderThan time.Duration) ([]recordstore.Record, error) {
	db, d, err := s.bound(ctx)
	if err != nil {
		return nil, err
	}
	var recs []recordstore.Record
	err = s.inTx(ctx, db, "claim key", func(tx executor) error {
		rows, err := tx.QueryContext(ctx, s.q.order.claimKey, topic, key, afterID, micros(olderThan))
		if err != nil {
			return s.fail("claim key", err)
		}
		if recs, err = s.scanRecords(rows, "claim key", 0); err != nil || len(recs) == 0 {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q.stamp+idList(d, 1, 1), recs[0].ID); err != nil {
			return s.fail("claim key", err)
		}
		return nil
	})
	return recs, err
}

var _ recordstore.KeyPredecessors = (*Store)(nil)

// Predecessors implements [recordstore.KeyPredecessors], in one statement
// per thousand ids.
func (s *Store) Predecessors(ctx context.Context, topic string, ids []int64) (map[int64]int64, error) {
	out := make(map[int64]int64, len(ids))
	err := queryOrder(ctx, s, "predecessors", s.q.order.predecessors, []any{topic}, ids, func(rows *sql.Rows) error {
		var id, before int64
		if err := rows.Scan(&id, &before); err != nil {
			return err
		}
		if before >= 0 {
			out[id] = before
		}
		return nil
	})
	return out, err
}

var _ recordstore.KeyPredecessorMessages = (*Store)(nil)

// PredecessorMessages implements [recordstore.KeyPredecessorMessages], in
// one statement per thousand ids.
func (s *Store) PredecessorMessages(ctx context.Context, topic string, ids []int64, skipAbandoned bool) (map[int64]recordstore.Predecessor, error) {
	out := make(map[int64]recordstore.Predecessor, len(ids))
	query := s.q.order.predecessorMessages[policy(recordstore.Delivery{SkipAbandoned: skipAbandoned})]
	err := queryOrder(ctx, s, "predecessor messages", query, []any{topic}, ids, func(rows *sql.Rows) error {
		var id, before int64
		var uuid sql.NullString
		if err := rows.Scan(&id, &before, &uuid); err != nil {
			return err
		}
		if before >= 0 {
			out[id] = recordstore.Predecessor{ID: before, UUID: uuid.String}
		}
		return nil
	})
	return out, err
}

var _ recordstore.KeyWaiters = (*Store)(nil)

// WaitingKeys implements [recordstore.KeyWaiters], in one statement per
// thousand keys, on the order index.
func (s *Store) WaitingKeys(ctx context.Context, topic string, keys []string, olderThan time.Duration) ([]string, error) {
	var out []string
	err := queryOrder(ctx, s, "waiting keys", s.q.order.waitingKeys, []any{topic, micros(max(olderThan, time.Microsecond))}, keys, func(rows *sql.Rows) error {
		var k string
		if err := rows.Scan(&k); err != nil {
			return err
		}
		out = append(out, k)
		return nil
	})
	return out, err
}

// queryOrder runs an order statement for items: one array argument after
// fixed, or, on a dialect without arrays, a list per chunk (queryLists).
func queryOrder[T any](ctx context.Context, s *Store, op, query string, fixed []any, items []T, scan func(*sql.Rows) error) error {
	if s.q.order.listed {
		return s.queryLists(ctx, op, query, fixed, anys(items), scan)
	}
	db, err := s.pool()
	if err != nil {
		return err
	}
	rows, err := db.QueryContext(ctx, query, append(fixed, items)...)
	if err != nil {
		return s.fail(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return s.fail(op, err)
		}
	}
	if err := rows.Err(); err != nil {
		return s.fail(op, err)
	}
	return nil
}

// PutBack implements [recordstore.KeyClaimer].
func (s *Store) PutBack(ctx context.Context, topic string, id int64) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	if _, err := s.execContext(ctx, db, s.q.order.putBack, dueLongAgo, id, topic); err != nil {
		return s.fail("put back", err)
	}
	return nil
}

// addHeldKeys sets the HeldKeys of the topics of out.
func (s *Store) addHeldKeys(ctx context.Context, db executor, out []recordstore.TopicStatus) error {
	rows, err := db.QueryContext(ctx, s.q.order.heldKeys)
	if err != nil {
		return s.fail("status", err)
	}
	defer rows.Close()
	for rows.Next() {
		var topic string
		var n int64
		if err := rows.Scan(&topic, &n); err != nil {
			return s.fail("status", err)
		}
		for i := range out {
			if out[i].Topic == topic {
				out[i].HeldKeys = n
			}
		}
	}
	if err := rows.Err(); err != nil {
		return s.fail("status", err)
	}
	return nil
}
