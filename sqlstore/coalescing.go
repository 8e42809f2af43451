package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// Coalescing configures how a [Store] combines concurrent calls into one
// statement. It uses no timer: a call that finds the store idle runs at once,
// alone; calls that arrive while MaxInFlight statements of their kind run
// wait for one of them to finish and then go together, as one multi-row
// INSERT, or one UPDATE (DELETE) … WHERE id IN (…) RETURNING id. So a quiet
// store adds no latency and a busy one spends one round trip, and one commit,
// on many calls.
//
// Each call still gets its own outcome: its own ids, in the order of its
// records; [recordstore.ErrNotPending] for its own id alone; its own error. A
// combined insert that the database refuses for the data of a row (a value
// or a constraint) is retried call by call, so that only the call whose
// record was refused fails; any other failure fails every call of that
// statement and no other. A call whose context ends while it waits leaves
// with the context's error; once its statement is on its way, the call waits
// for the statement's real outcome, which is cancelled only when every call
// in it has given up.
type Coalescing struct {
	// DisableInsert makes every Insert call run its own statement. Defaults
	// to false: concurrent inserts are combined.
	DisableInsert bool
	// DisableCheck makes every CheckPending call run its own query.
	// Defaults to false: on PostgreSQL, concurrent checks of stores without
	// a lease are combined into one query over arrays of ids and
	// consumers. Elsewhere each check runs its own query.
	DisableCheck bool
	// DisableComplete makes every Complete call run its own statement.
	// Defaults to false: concurrent completions are combined wherever the
	// dialect can report which of the ids a statement completed (PostgreSQL
	// and SQLite always; elsewhere one statement per id).
	DisableComplete bool
	// MaxBatch is the most records (for completions, ids) one combined
	// statement carries; a single call with more records runs on its own.
	// Defaults to 1000.
	MaxBatch int
	// MaxInFlight is how many statements of each kind (insert, complete) one
	// store runs at the same time, and so how many pooled connections it
	// holds at most for them. Calls that arrive while that many run are
	// combined into the next statement. One gives the largest batches, which
	// is what a busy database needs, and all SQLite can use: it runs one
	// write at a time. Its price is that callers coming back while a
	// statement runs wait for it, which a database with idle cores that
	// mostly waits for its disk to commit does not need: there, raise it to
	// about the number of callers that usually publish at once, and batches
	// form only beyond that. Defaults to 1.
	MaxInFlight int
	// InsertsAloneBelow lets an Insert call run at once, on its own
	// connection, beyond MaxInFlight, while no call waits, fewer than this
	// many calls are being inserted, and none of the last 64 to 128 Insert
	// calls found more than this many calls being inserted, waiting or
	// arriving. With a few publishers, waiting for the insert in flight
	// costs a disk flush, more than combining saves; with more, every
	// insert waits and combines as before. Defaults to 4 on PostgreSQL
	// (measured in docs/benchmarks.md) and off elsewhere: SQLite writes one
	// statement at a time, and MySQL/MariaDB were not measured. A negative
	// value turns it off.
	InsertsAloneBelow int
}

func (c *Coalescing) setDefaults() {
	if c.MaxBatch == 0 {
		c.MaxBatch = 1000
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 1
	}
}

// Validate reports a configuration error, if any.
func (c Coalescing) Validate() error {
	if c.MaxBatch < 1 {
		return fmt.Errorf("%w: Coalescing.MaxBatch %d must be positive", ErrInvalidConfig, c.MaxBatch)
	}
	if c.MaxInFlight < 1 {
		return fmt.Errorf("%w: Coalescing.MaxInFlight %d must be positive", ErrInvalidConfig, c.MaxInFlight)
	}
	if c.InsertsAloneBelow > c.MaxBatch {
		return fmt.Errorf("%w: Coalescing.InsertsAloneBelow %d is above MaxBatch %d", ErrInvalidConfig, c.InsertsAloneBelow, c.MaxBatch)
	}
	return nil
}

// insertBatch saves the records of every call with one statement and hands
// each call its own ids.
func (s *Store) insertBatch(ctx context.Context, batch []*call[[]recordstore.Record]) {
	n := 0
	for _, c := range batch {
		n += len(c.arg)
	}
	all := make([]recordstore.Record, 0, n)
	for _, c := range batch {
		all = append(all, c.arg...)
	}
	err := s.insertNow(ctx, all)
	switch {
	case err == nil:
		// Each record comes back whole: one whose Origin was saved
		// carries the saved record.
		i := 0
		for _, c := range batch {
			for j := range c.arg {
				c.arg[j] = all[i]
				i++
			}
		}
	case errors.Is(err, ErrInvalidRecord) || errors.Is(err, ErrRecordTooLarge) || s.dialect.recordError(err):
		// One call's record may be to blame: each call gets its own
		// statement, on its own context, and its own outcome.
		for _, c := range batch {
			c.err = s.insertNow(c.ctx, c.arg)
		}
	default:
		for _, c := range batch {
			c.err = err
		}
	}
}

// checkBatch reads the state of every call's delivery with one query and
// gives each call CheckPending's verdict on it.
func (s *Store) checkBatch(ctx context.Context, batch []*call[recordstore.Delivery]) {
	db, err := s.pool()
	if err == nil {
		err = s.readStates(ctx, db, batch)
	}
	if err != nil {
		for _, c := range batch {
			c.err = err
		}
	}
}

// readStates runs q.stateMany for the batch and sets each call's verdict.
func (s *Store) readStates(ctx context.Context, db *sqlx.DB, batch []*call[recordstore.Delivery]) error {
	ids := make([]int64, len(batch))
	consumers := make([]string, len(batch))
	for i, c := range batch {
		ids[i], consumers[i] = c.arg.ID, c.arg.Consumer
	}
	rows, err := db.QueryContext(ctx, s.q.stateMany, ids, consumers)
	if err != nil {
		return s.fail("check pending", err)
	}
	defer rows.Close()
	type key struct {
		id       int64
		consumer string
	}
	states := make(map[key]recordState, len(batch))
	for rows.Next() {
		var k key
		st, err := scanState(rows, &k.id, &k.consumer)
		if err != nil {
			return s.fail("check pending", err)
		}
		states[k] = st
	}
	if err := rows.Err(); err != nil {
		return s.fail("check pending", err)
	}
	for _, c := range batch {
		st, found := states[key{c.arg.ID, c.arg.Consumer}]
		if lacksDelivery(st, found, c.arg) {
			// Adopted on the single path, which reads the state again.
			c.err = s.checkPending(c.ctx, db, c.arg)
			continue
		}
		c.err = s.decide(st, found, c.arg)
	}
	return nil
}

// completeBatch completes the records without consumers of every call with
// one statement per consumer (a marking table records who completed each;
// a deleting table needs one statement in all), skipping the rows another
// transaction holds. A record completed by it satisfies the first call for
// its id. Every other call, for a record with consumers, one that was not
// pending, held or not for the record's message, or the same id again,
// finishes alone (completeNow, on its own goroutine once the batch is
// done), which completes the consumer's delivery, waits for the
// transaction that holds the row, or reports ErrNotPending; so the batch
// and the calls behind it never wait for another delivery's transaction.
func (s *Store) completeBatch(ctx context.Context, batch []*call[recordstore.Delivery]) {
	db, err := s.pool()
	if err != nil {
		for _, c := range batch {
			c.err = err
		}
		return
	}
	groups := map[string][]*call[recordstore.Delivery]{}
	var order []string
	for _, c := range batch {
		if declares(c.arg) {
			// Never completed as a record without consumers (adopt.go).
			c.err = errAlone
			continue
		}
		key := ""
		if s.q.mark {
			key = c.arg.Consumer
		}
		if _, ok := groups[key]; !ok {
			order = append(order, key)
		}
		groups[key] = append(groups[key], c)
	}
	for _, consumer := range order {
		s.completeGroup(ctx, db, consumer, groups[consumer])
	}
}

// completeGroup completes the calls of one consumer (of every consumer on
// a deleting table) for completeBatch. Only the first call for an id goes
// into the statement, with its message's UUID, so that a completed id is
// that call's alone. Every call it did not complete finishes alone
// (errAlone).
func (s *Store) completeGroup(ctx context.Context, db *sqlx.DB, consumer string, group []*call[recordstore.Delivery]) {
	first := make(map[int64]*call[recordstore.Delivery], len(group))
	ids := make([]int64, 0, len(group))
	uuids := make([]string, 0, len(group))
	for _, c := range group {
		if _, dup := first[c.arg.ID]; !dup {
			first[c.arg.ID] = c
			ids = append(ids, c.arg.ID)
			uuids = append(uuids, c.arg.UUID)
		}
	}
	done, err := s.dialect.completeMany(ctx, db, s.q, consumer, ids, uuids)
	if err != nil {
		err = s.fail("complete", err)
		for _, c := range group {
			c.err = err
		}
		return
	}
	completed := make(map[int64]bool, len(done))
	for _, id := range done {
		completed[id] = true
	}
	for _, c := range group {
		if c == first[c.arg.ID] && completed[c.arg.ID] {
			continue
		}
		c.err = errAlone
	}
}
