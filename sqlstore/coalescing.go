package sqlstore

import (
	"fmt"
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
	// DisableComplete makes every Complete call, and every delivery of a
	// CompleteBatch call, run its own statement. Defaults to false:
	// concurrent completions are combined on PostgreSQL and SQLite, whose
	// statements report which ids they completed; on MySQL and MariaDB
	// the deliveries of one CompleteBatch call complete in one
	// transaction of two statements, and each Complete call alone.
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
	// arriving: with a few publishers, an insert then need not wait for a
	// disk flush, and with more, every insert waits and combines as
	// without it. Its price is a commit per insert. Defaults to 0, off, as
	// is a negative value: on PostgreSQL at 4 publishers, 4 ran at 0.84×
	// to 0.91× the rate of always combining, with 1.8× to 2.3× its
	// database CPU per message, in three runs (docs/benchmarks.md). Try it where the database has idle cores and
	// its disk flush dominates; SQLite writes one statement at a time, so
	// there an insert alone only waits for the lock.
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
