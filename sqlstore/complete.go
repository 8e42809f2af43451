package sqlstore

// Complete and CompleteTx: completing a delivery, alone or many at once.

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// A record saved with consumers has one delivery row per consumer in the
// table <table>_consumers, and its own row counts them (consumers > 0). The
// record stays pending until none of its deliveries is: then it is
// completed (marked, or deleted with its delivery rows) when every delivery
// was completed, and abandoned when one was abandoned.
//
// Every write to the deliveries of a record first writes the record's row
// (lockRecord, or a SELECT … FOR UPDATE of it), so that writers of one
// record serialize on it, in the same order, on every database; the one
// that leaves no delivery pending sees every other's completion and rolls
// the record up.

var _ recordstore.TxCompleter = (*Store)(nil)

// Complete implements [recordstore.Store]. Concurrent calls are combined into one
// statement as [Coalescing] says; each gets its own outcome. A delivery
// whose [recordstore.Delivery.UUID] is not the record's completes nothing
// and gets [recordstore.ErrNotPending]: the statement that completes
// matches no row, and telling why would cost another round trip. A delivery
// with a value the table cannot keep is refused before it can join another
// call's statement (see values.go).
func (s *Store) Complete(ctx context.Context, d recordstore.Delivery) error {
	if _, err := s.pool(); err != nil {
		return err
	}
	if err := s.refuses("complete", d, true); err != nil {
		return err
	}
	if s.completes == nil {
		return s.completeNow(ctx, d)
	}
	return s.completes.do(ctx, d, 1)
}

var _ recordstore.BatchCompleter = (*Store)(nil)

// CompleteBatch implements [recordstore.BatchCompleter]: the deliveries
// complete as concurrent Complete calls would, and with coalescing (the
// default where the dialect allows it) those of records without consumers
// go into one statement, or into the statement of the calls that wait
// when one is in flight, rather than the first alone and the rest after.
// Every other delivery, and each one the statement did not complete,
// completes on its own, concurrently with those of other records; of two
// deliveries of one record and consumer, the first completes it.
func (s *Store) CompleteBatch(ctx context.Context, ds []recordstore.Delivery) []error {
	errs := make([]error, len(ds))
	if _, err := s.pool(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	var together []int
	for i, d := range ds {
		if errs[i] = s.refuses("complete", d, true); errs[i] != nil {
			continue
		}
		if s.combinesBatches() && !declares(d) {
			together = append(together, i)
			continue
		}
		errs[i] = errAlone
	}
	if len(together) > 0 {
		args := make([]recordstore.Delivery, len(together))
		for j, i := range together {
			args[j] = ds[i]
		}
		for j, err := range s.completeTogether(ctx, args) {
			errs[together[j]] = err
		}
	}
	// The deliveries left complete concurrently, but those of one record
	// and consumer in turn, so that the first of them is the one that
	// completes.
	alone := map[completingDelivery][]int{}
	var order []completingDelivery
	for i, err := range errs {
		if err == errAlone { //nolint:errorlint // set as it is, never wrapped
			k := completingDelivery{ds[i].ID, ds[i].Consumer}
			if _, ok := alone[k]; !ok {
				order = append(order, k)
			}
			alone[k] = append(alone[k], i)
		}
	}
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Go(func() {
			for _, i := range alone[k] {
				errs[i] = s.completeNow(ctx, ds[i])
			}
		})
	}
	wg.Wait()
	return errs
}

// combinesBatches reports whether CompleteBatch completes the deliveries
// of records without consumers together: through the coalescer, or, on a
// dialect whose combined completion is a transaction of its own
// (lockedCompleteMany), in one such transaction per call.
func (s *Store) combinesBatches() bool {
	return s.completes != nil || !s.coalescing.DisableComplete && s.dialect.completeMany != nil
}

// completeTogether completes ds, deliveries of records without consumers,
// for CompleteBatch; errAlone for those to complete on their own.
func (s *Store) completeTogether(ctx context.Context, ds []recordstore.Delivery) []error {
	if s.completes != nil {
		return s.completes.doAll(ctx, ds)
	}
	calls := make([]*call[recordstore.Delivery], len(ds))
	for i, d := range ds {
		calls[i] = &call[recordstore.Delivery]{ctx: ctx, arg: d, items: 1}
	}
	maxItems := s.coalescing.MaxBatch
	if maxItems <= 0 {
		maxItems = len(calls)
	}
	for start := 0; start < len(calls); start += maxItems {
		s.completeBatch(ctx, calls[start:min(start+maxItems, len(calls))])
	}
	errs := make([]error, len(calls))
	for i, c := range calls {
		errs[i] = c.err
	}
	return errs
}

// completingDelivery names a delivery in CompleteBatch.
type completingDelivery struct {
	id       int64
	consumer string
}

// completeNow completes one delivery: a record without consumers with one
// statement, a consumer's delivery otherwise (see completeDelivery). The
// delivery of a consumer its topic declares never completes a record as
// one without consumers: such a record is adopted (adopt.go).
func (s *Store) completeNow(ctx context.Context, d recordstore.Delivery) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	if declares(d) {
		return s.completeDeliveryNow(ctx, db, d)
	}
	n, err := s.exec(ctx, db, "complete", s.q.completeAlone, s.completeArgs(d)...)
	if err != nil {
		return err
	}
	if n == 1 {
		return nil
	}
	return s.completeDeliveryNow(ctx, db, d)
}

// completeFast is the coalesced path's completion of one delivery, run in
// a statement slot: it never waits for a row that another transaction
// holds (a CompleteTx still open), and leaves a consumer's delivery, whose
// completion locks its record's row, to completeNow outside the slot
// (errAlone), so that no completion waits for another's transaction.
func (s *Store) completeFast(ctx context.Context, d recordstore.Delivery) error {
	if s.q.completeUnheld == "" {
		return s.completeNow(ctx, d)
	}
	if declares(d) {
		return errAlone
	}
	db, err := s.pool()
	if err != nil {
		return err
	}
	n, err := s.exec(ctx, db, "complete", s.q.completeUnheld, s.completeArgs(d)...)
	if err != nil {
		return err
	}
	if n == 1 {
		return nil
	}
	return errAlone
}

// completeArgs are the arguments of q.complete.
func (s *Store) completeArgs(d recordstore.Delivery) []any {
	if s.q.mark {
		return []any{d.Consumer, d.ID, d.UUID, d.UUID}
	}
	return []any{d.ID, d.UUID, d.UUID}
}

// CompleteTx implements [recordstore.TxCompleter] with the store's own
// statements run through the caller's transaction tx. A record without
// consumers is completed by one statement (UPDATE … SET processed_at, or
// DELETE) that locks its row, which is what a SELECT … FOR UPDATE would do,
// and completes it in the same round trip; a consumer's delivery is
// completed as Complete does, after a write that locks the record's row:
//
//   - PostgreSQL and MySQL/MariaDB (InnoDB) lock the row until tx ends. A
//     concurrent CompleteTx of the same delivery waits; when the first
//     transaction commits, it re-reads the row, matches nothing and returns
//     [recordstore.ErrNotPending]; when the first rolls back, it completes the
//     delivery itself. Under REPEATABLE READ or SERIALIZABLE, PostgreSQL
//     reports the concurrent completion as a serialization failure instead,
//     which the handler returns, and the redelivery finds the record
//     completed.
//   - SQLite has no row locks: a writing transaction holds the database's
//     single write lock until it ends, so concurrent completions are
//     serialized by the busy timeout (set _pragma=busy_timeout(…) in the
//     DSN). Run CompleteTx as the first statement of the transaction, or
//     open the pool with _txlock=immediate: a deferred transaction that read
//     before it writes cannot wait for the lock and fails with SQLITE_BUSY.
func (s *Store) CompleteTx(ctx context.Context, tx recordstore.Tx, d recordstore.Delivery) error {
	if tx == nil {
		return fmt.Errorf("%w: transaction is nil", ErrInvalidConfig)
	}
	if err := s.refuses("complete in transaction", d, true); err != nil {
		// Refused before the statement, which on PostgreSQL would
		// abort tx.
		return err
	}
	if !declares(d) {
		n, err := s.exec(ctx, tx, "complete in transaction", s.q.complete, s.completeArgs(d)...)
		if err != nil {
			return err
		}
		if n == 1 {
			return nil
		}
	}
	return s.completeDelivery(ctx, tx, d, "complete in transaction", s.q.lockRecord)
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
	done, err := s.dialect.completeMany(ctx, s.dialect, db, s.q, consumer, ids, uuids)
	if err != nil && len(ids) > 1 && s.dialect.invalidValue(err) {
		// One call's value, refused by the database: each call alone,
		// so that only that one is.
		for _, c := range group {
			c.err = errAlone
		}
		return
	}
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

// completeDeliveryNow completes the delivery of a record with consumers in
// a transaction of its own; ErrNotPending when there is none pending.
func (s *Store) completeDeliveryNow(ctx context.Context, db *sqlx.DB, d recordstore.Delivery) error {
	return s.inTx(ctx, db, "complete", func(tx executor) error { return s.completeDelivery(ctx, tx, d, "complete", s.q.lockRecordAlone) })
}

// completeDelivery locks the record of d with the lock statement (a
// lazy-commit one in a transaction of the store's own), completes d's
// delivery and rolls the record up, through tx. A delivery that is not
// pending, or whose message is not the record's, gets ErrNotPending.
func (s *Store) completeDelivery(ctx context.Context, tx executor, d recordstore.Delivery, op, lock string) error {
	if _, err := tx.ExecContext(ctx, lock, d.ID); err != nil {
		return s.fail(op, err)
	}
	args := []any{d.ID, d.Consumer, d.ID, d.UUID, d.UUID}
	n, err := s.exec(ctx, tx, op, s.q.completeDelivery, args...)
	if err != nil {
		return err
	}
	if n == 0 && declares(d) {
		// A record saved before its topic declared this consumer, unless
		// it was not pending; adopted by a concurrent delivery meanwhile
		// when adopt adds nothing.
		if _, err := s.adopt(ctx, tx, d, op); err != nil {
			return err
		}
		if n, err = s.exec(ctx, tx, op, s.q.completeDelivery, args...); err != nil {
			return err
		}
	}
	if n == 0 {
		return recordstore.ErrNotPending
	}
	return s.rollUp(ctx, tx, d.ID, op)
}

// rollUp completes or abandons the record once none of its deliveries is
// pending. The caller holds the record's lock.
func (s *Store) rollUp(ctx context.Context, tx executor, id int64, op string) error {
	rows, err := tx.QueryContext(ctx, s.q.deliveries, id)
	if err != nil {
		return s.fail(op, err)
	}
	defer rows.Close()
	pending, abandoned := 0, 0
	for rows.Next() {
		var p, a int
		if err := rows.Scan(&p, &a); err != nil {
			return s.fail(op, err)
		}
		pending += p
		abandoned += a
	}
	if err := rows.Err(); err != nil {
		return s.fail(op, err)
	}
	rows.Close()
	switch {
	case pending > 0:
		return nil
	case abandoned > 0:
		_, err = tx.ExecContext(ctx, s.q.abandonRecord, id)
	case s.q.mark:
		_, err = tx.ExecContext(ctx, s.q.finishRecord, id)
	default:
		if _, err = tx.ExecContext(ctx, s.q.dropDeliveries, id); err == nil {
			_, err = tx.ExecContext(ctx, s.q.finishRecord, id)
		}
	}
	if err != nil {
		return s.fail(op, err)
	}
	return nil
}

// buildComplete builds the statements of Complete: of a record without
// consumers, alone or many at once, and of one consumer's delivery with the
// roll-up of its record.
func (q *queries) buildComplete(f fragments, mode Completion) {
	t, tc, p, clock := f.t, f.tc, f.p, f.clock
	// lazyFrom and lazyUsing join an UPDATE and a DELETE with the lazy
	// commit's row source; empty without one.
	lazyFrom, lazyUsing := "", ""
	if f.lazy != "" {
		lazyFrom, lazyUsing = " FROM "+f.lazy, " USING "+f.lazy
	}
	if f.mark {
		complete := "UPDATE %s SET processed_at = %s, completed_by = %s%s WHERE id = %s AND %s AND processed_at IS NULL AND consumers = 0"
		q.complete = fmt.Sprintf(complete, t, clock, p(1), "", p(2), f.message("uuid", 3))
		q.completeAlone = fmt.Sprintf(complete, t, clock, p(1), lazyFrom, p(2), f.message("uuid", 3))
		q.completeIn = fmt.Sprintf("UPDATE %s SET processed_at = %s, completed_by = %s WHERE processed_at IS NULL AND consumers = 0 AND id IN (",
			t, clock, p(1))
		q.lockIn = fmt.Sprintf("SELECT id FROM %s%s WHERE processed_at IS NULL AND consumers = 0 AND id IN (", t, f.d.forceIndex("PRIMARY"))
		q.writeIn = fmt.Sprintf("UPDATE ({ids}) AS k STRAIGHT_JOIN %s AS r ON r.id = k.id SET r.processed_at = %s, r.completed_by = {consumer}", t, clock)
		q.finishRecord = fmt.Sprintf("UPDATE %s SET processed_at = %s WHERE id = %s", t, clock, p(1))
		q.abandonRecord = fmt.Sprintf("UPDATE %s SET abandoned_at = %s, processed_at = %s WHERE id = %s", t, clock, clock, p(1))
	} else {
		complete := "DELETE FROM %s%s WHERE id = %s AND %s AND consumers = 0 AND abandoned_at IS NULL"
		q.complete = fmt.Sprintf(complete, t, "", p(1), f.message("uuid", 2))
		q.completeAlone = fmt.Sprintf(complete, t, lazyUsing, p(1), f.message("uuid", 2))
		q.completeIn = fmt.Sprintf("DELETE FROM %s WHERE consumers = 0 AND abandoned_at IS NULL AND id IN (", t)
		q.lockIn = fmt.Sprintf("SELECT id FROM %s%s WHERE consumers = 0 AND abandoned_at IS NULL AND id IN (", t, f.d.forceIndex("PRIMARY"))
		q.writeIn = fmt.Sprintf("DELETE r FROM ({ids}) AS k STRAIGHT_JOIN %s AS r ON r.id = k.id", t)
		q.finishRecord = fmt.Sprintf("DELETE FROM %s WHERE id = %s", t, p(1))
		q.abandonRecord = fmt.Sprintf("UPDATE %s SET abandoned_at = %s WHERE id = %s", t, clock, p(1))
	}
	q.completeMany, q.completeUnheld = f.d.completeQueries(t, mode, f.lazy)
	lock := "UPDATE %s SET consumers = consumers%s WHERE id = %s AND consumers > 0"
	q.lockRecord = fmt.Sprintf(lock, t, "", p(1))
	q.lockRecordAlone = fmt.Sprintf(lock, t, lazyFrom, p(1))
	// The delivery rows do not know the message: the record's row, locked
	// by then, does.
	q.completeDelivery = fmt.Sprintf("UPDATE %s SET processed_at = %s WHERE record_id = %s AND consumer = %s AND %s AND EXISTS (SELECT 1 FROM %s r WHERE r.id = %s AND %s)",
		tc, clock, p(1), p(2), deliveryPending, t, p(3), f.message("r.uuid", 4))
	q.deliveries = fmt.Sprintf("SELECT CASE WHEN %s THEN 1 ELSE 0 END, CASE WHEN abandoned_at IS NULL THEN 0 ELSE 1 END FROM %s WHERE record_id = %s%s",
		deliveryPending, tc, p(1), f.d.lockRows(false))
	q.dropDeliveries = fmt.Sprintf("DELETE FROM %s WHERE record_id = %s", tc, p(1))
}

// completeInQuery lists n ids after the completion prefix, from placeholder
// first on, and returns the ids completed, for dialects that have RETURNING
// but no array parameter. The named ids among them, those whose delivery
// names its message, follow as (id, UUID) pairs of placeholders, and a
// record of one of them completes only when it was saved with that UUID
// (ids are distinct, so each pair is the one of its id).
func completeInQuery(d *Dialect, q *queries, first, n, named int) string {
	return inListQuery(d, q.completeIn, " RETURNING id", first, n, named)
}

// inListArgs appends the arguments of inListQuery's list to args: the ids
// of ids[start:end], then the id and UUID of each of them whose delivery
// names its message (uuids[i] not ""), whose count it returns too.
func inListArgs(args []any, ids []int64, uuids []string, start, end int) ([]any, int) {
	for _, id := range ids[start:end] {
		args = append(args, id)
	}
	named := 0
	for i := start; i < end; i++ {
		if uuids[i] != "" {
			args = append(args, ids[i], uuids[i])
			named++
		}
	}
	return args, named
}

// inListQuery is completeInQuery's text with the statement prefix (ending
// in "id IN (") and suffix given.
func inListQuery(d *Dialect, prefix, suffix string, first, n, named int) string {
	var b strings.Builder
	b.Grow(len(prefix) + n*4 + named*16 + len(suffix) + 20)
	b.WriteString(prefix)
	for i := first; i < first+n; i++ {
		if i > first {
			b.WriteByte(',')
		}
		b.WriteString(d.placeholder(i))
	}
	b.WriteByte(')')
	if named > 0 {
		b.WriteString(" AND uuid = CASE id")
		for i := range named {
			p := first + n + 2*i
			fmt.Fprintf(&b, " WHEN %s THEN %s", d.placeholder(p), d.placeholder(p+1))
		}
		b.WriteString(" ELSE uuid END")
	}
	b.WriteString(suffix)
	return b.String()
}
