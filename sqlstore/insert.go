package sqlstore

// Insert and InsertTx: saving records, their deliveries and their origins.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.TxInserter = (*Store)(nil)

// Insert implements [recordstore.Store]. Concurrent calls are combined into one
// statement as [Coalescing] says; each gets its own ids and its own error.
func (s *Store) Insert(ctx context.Context, records []recordstore.Record) error {
	if len(records) == 0 {
		return nil
	}
	if _, err := s.pool(); err != nil {
		return err
	}
	if s.inserts == nil {
		return s.insertNow(ctx, records)
	}
	return s.inserts.do(ctx, records, len(records))
}

// insertNow saves records with one statement (several for MySQL batches
// larger than a packet), and, when some declare consumers, their deliveries
// in the same transaction.
func (s *Store) insertNow(ctx context.Context, records []recordstore.Record) error {
	db, d, err := s.bound(ctx)
	if err != nil {
		return err
	}
	if err := s.insertWith(ctx, db, d, "insert", records); err != nil {
		if errors.Is(err, ErrInvalidRecord) || errors.Is(err, ErrRecordTooLarge) {
			return err
		}
		return s.failInsert(db, d, err)
	}
	return nil
}

// failInsert is fail for an insert, saying also whether the records may
// have been saved ([recordstore.ErrOutcomeUnknown]) and, when ctx ended
// while every connection of the pool was in use, what that usually means.
func (s *Store) failInsert(db *sqlx.DB, d *Dialect, err error) error {
	te := *s.fail("insert", err).(*TableError) //nolint:errorlint // fail returns a *TableError
	if st := db.Stats(); errors.Is(err, context.DeadlineExceeded) && st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
		te.Err = fmt.Errorf("%w (all %d connection(s) of the pool were in use: a publish inside a transaction of the same pool, such as a CompleteTx transaction, waits for a connection that transaction holds; publish with outbox.TxPublisher in that transaction, or give the pool more connections)", te.Err, st.MaxOpenConnections)
	}
	if !d.answered(err) {
		te.Err = fmt.Errorf("%w: %w", recordstore.ErrOutcomeUnknown, te.Err)
	}
	return &te
}

// insertWith saves records through db, the pool or a caller's
// transaction; a batch in which some records have an Origin goes through
// insertKeyed.
func (s *Store) insertWith(ctx context.Context, db executor, d *Dialect, op string, records []recordstore.Record) error {
	if keyed(records) {
		return s.insertKeyed(ctx, db, d, op, records)
	}
	return s.insertRows(ctx, db, d, op, &s.q.insert, records)
}

// insertRows saves records with the statements st. Records without
// consumers that fit one statement cost the one statement they always did;
// a batch that needs several statements, and the deliveries of records with
// consumers, are saved in one transaction (inTx fails as op). Refused
// records are reported before anything is sent.
func (s *Store) insertRows(ctx context.Context, db executor, d *Dialect, op string, st *insertStatements, records []recordstore.Record) error {
	metadata := make([]string, len(records))
	for i, r := range records {
		md, err := encodeMetadata(r.Metadata)
		if err != nil {
			return fmt.Errorf("record #%d: %w", i, err)
		}
		if err := checkOrderKey(r.OrderKey); err != nil {
			return fmt.Errorf("record #%d: %w", i, err)
		}
		metadata[i] = md
	}
	bounds, err := d.splitInsert(st, records, metadata)
	if err != nil {
		return err
	}
	withConsumers := declaresConsumers(records)
	if len(bounds) == 2 && !withConsumers {
		return d.insert(ctx, db, st, records, metadata)
	}
	return s.inTx(ctx, db, op, func(tx executor) error {
		for i := 1; i < len(bounds); i++ {
			from, to := bounds[i-1], bounds[i]
			if err := d.insert(ctx, tx, st, records[from:to], metadata[from:to]); err != nil {
				return err
			}
		}
		if !withConsumers {
			return nil
		}
		return s.insertDeliveries(ctx, tx, records)
	})
}

// InsertTx implements [recordstore.TxInserter]: the same statements as Insert,
// run through the caller's transaction tx, which must be on the store's
// database. A MySQL store needs its pool attached even so: it learns the
// server from it once; the pool tx comes from needs interpolateParams=true
// too, or each statement costs a prepare and a close.
func (s *Store) InsertTx(ctx context.Context, tx recordstore.Tx, records []recordstore.Record) error {
	if tx == nil {
		return fmt.Errorf("%w: transaction is nil", ErrInvalidConfig)
	}
	if len(records) == 0 {
		return nil
	}
	d := s.dialect
	if d.probe != nil {
		var err error
		if _, d, err = s.bound(ctx); err != nil {
			return err
		}
	}
	if err := s.insertWith(ctx, tx, d, "insert in transaction", records); err != nil {
		if errors.Is(err, ErrInvalidRecord) {
			return err
		}
		return s.fail("insert in transaction", err)
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

// insertStatements are the statements that save records, with or without
// the origin column.
type insertStatements struct {
	values string // INSERT ... VALUES prefix, for dialects that append rows
	one    string // one row, RETURNING id
	batch  string // fixed-text batch insert, if the dialect has one
	// origin is true when each row carries Record.Origin and
	// Record.OrderKey as a fifth and sixth value (originArg).
	origin bool
}

// buildInsert builds the statements of Insert.
func (q *queries) buildInsert(f fragments) {
	t, tc, p := f.t, f.tc, f.p
	values := fmt.Sprintf("INSERT INTO %s (topic, uuid, payload, metadata) VALUES ", t)
	q.insert = insertStatements{values: values, batch: f.d.insertQuery(t, f.table.name, false),
		one: fmt.Sprintf("%s(%s, %s, %s, %s) RETURNING id", values, p(1), p(2), p(3), p(4))}
	values = fmt.Sprintf("INSERT INTO %s (topic, uuid, payload, metadata, origin, order_key) VALUES ", t)
	q.insertKeyed = insertStatements{values: values, batch: f.d.insertQuery(t, f.table.name, true), origin: true,
		one: fmt.Sprintf("%s(%s, %s, %s, %s, %s, %s) RETURNING id", values, p(1), p(2), p(3), p(4), p(5), p(6))}
	if f.d.insertOriginOneSQL != "" {
		q.insertKeyed.one = fill(f.d.insertOriginOneSQL, "{table}", t, "{seed}", tableSeed(f.table.name))
	}
	q.savedOrigins = fmt.Sprintf("SELECT id, uuid, payload, metadata, origin FROM %s WHERE origin IN ", t)
	q.insertDeliveries = fmt.Sprintf("INSERT INTO %s (record_id, consumer) VALUES ", tc)
	q.setConsumers = fmt.Sprintf("UPDATE %s SET consumers = %s WHERE id IN ", t, p(1))
}

// insertSingle saves one record with a statement of fixed text, for
// dialects with INSERT … RETURNING: the common case of one message per
// Publish needs no array and no statement built per call.
func insertSingle(ctx context.Context, db executor, st *insertStatements, r *recordstore.Record, metadata string) error {
	if st.origin {
		return db.QueryRowContext(ctx, st.one, r.Topic, r.UUID, payloadOf(r.Payload), metadata, originArg(r.Origin), originArg(r.OrderKey)).Scan(&r.ID)
	}
	return db.QueryRowContext(ctx, st.one, r.Topic, r.UUID, payloadOf(r.Payload), metadata).Scan(&r.ID)
}

// valuesInsert is st's multi-row INSERT … VALUES of records, for the
// dialects with ? placeholders, and its arguments; topic is a record's
// topic as the column takes it; suffix ends the statement (RETURNING id,
// or "").
func valuesInsert(st *insertStatements, records []recordstore.Record, metadata []string, topic func(string) any, suffix string) (string, []any) {
	row, perRow := "(?,?,?,?)", 4
	if st.origin {
		row, perRow = "(?,?,?,?,?,?)", 6
	}
	var b strings.Builder
	b.Grow(len(st.values) + len(records)*(len(row)+1) + len(suffix))
	b.WriteString(st.values)
	args := make([]any, 0, len(records)*perRow)
	for i, r := range records {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(row)
		args = append(args, topic(r.Topic), r.UUID, payloadOf(r.Payload), metadata[i])
		if st.origin {
			args = append(args, originArg(r.Origin), originArg(r.OrderKey))
		}
	}
	b.WriteString(suffix)
	return b.String(), args
}

// originArg is a record's origin (or order key) as a statement argument:
// NULL for none (the order index then leaves the record out too),
// so that the unique index leaves records without one alone.
func originArg(origin string) any {
	if origin == "" {
		return nil
	}
	return origin
}

// encodeMetadata stores metadata as a JSON object. JSON cannot carry invalid
// UTF-8 (encoding/json would silently replace it), so such metadata is
// refused rather than changed.
func encodeMetadata(md message.Metadata) (string, error) {
	if len(md) == 0 {
		return "{}", nil
	}
	for k, v := range md {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return "", fmt.Errorf("%w: metadata key %q is not valid UTF-8", ErrInvalidRecord, k)
		}
	}
	b, err := json.Marshal(md)
	if err != nil {
		return "", fmt.Errorf("%w: metadata: %v", ErrInvalidRecord, err)
	}
	return string(b), nil
}

// checkOrderKey refuses an order key that the order_key column of every
// database cannot keep byte for byte.
func checkOrderKey(key string) error {
	if len(key) > recordstore.MaxOrderKeyLen {
		return fmt.Errorf("%w: order key of %d bytes, at most %d", ErrInvalidRecord, len(key), recordstore.MaxOrderKeyLen)
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("%w: order key is not valid UTF-8", ErrInvalidRecord)
	}
	return nil
}

func payloadOf(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// scanIDs reads the ids a batch insert returned and assigns them in
// ascending order, which is the order the rows were inserted in.
func scanIDs(rows rowsScanner, records []recordstore.Record) error {
	ids, err := scanIDList(rows, make([]int64, 0, len(records)))
	if err != nil {
		return err
	}
	if len(ids) != len(records) {
		return fmt.Errorf("insert returned %d ids for %d records", len(ids), len(records))
	}
	slices.Sort(ids)
	for i := range records {
		records[i].ID = ids[i]
	}
	return nil
}

// declaresConsumers reports whether a record of the batch has consumers.
func declaresConsumers(records []recordstore.Record) bool {
	for _, r := range records {
		if len(r.Consumers) > 0 {
			return true
		}
	}
	return false
}

// distinctConsumers returns the consumers of r once each, in order.
func distinctConsumers(r recordstore.Record) []string {
	out := make([]string, 0, len(r.Consumers))
	for _, c := range r.Consumers {
		dup := false
		for _, o := range out {
			if o == c {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, c)
		}
	}
	return out
}

// insertDeliveries saves one pending delivery per consumer of the records,
// whose ids are set, and records how many each has, through tx.
func (s *Store) insertDeliveries(ctx context.Context, tx executor, records []recordstore.Record) error {
	byCount, err := s.insertDeliveryRows(ctx, tx, records)
	if err != nil {
		return err
	}
	for n, ids := range byCount {
		if err := execLists(ctx, tx, s.dialect, s.q.setConsumers, []any{n}, anys(ids)); err != nil {
			return err
		}
	}
	return nil
}

// insertDeliveryRows saves one pending delivery per consumer of the
// records, whose ids are set, through tx, and returns the ids of the
// records with consumers by their number of consumers.
func (s *Store) insertDeliveryRows(ctx context.Context, tx executor, records []recordstore.Record) (map[int][]int64, error) {
	d := s.dialect
	byCount := map[int][]int64{}
	var b strings.Builder
	args := make([]any, 0, 2*deliveryChunk)
	flush := func() error {
		if len(args) == 0 {
			return nil
		}
		_, err := tx.ExecContext(ctx, b.String(), args...)
		b.Reset()
		args = args[:0]
		return err
	}
	for _, r := range records {
		cs := distinctConsumers(r)
		if len(cs) == 0 {
			continue
		}
		byCount[len(cs)] = append(byCount[len(cs)], r.ID)
		for _, c := range cs {
			if len(args) == 0 {
				b.WriteString(s.q.insertDeliveries)
			} else {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "(%s, %s)", d.placeholder(len(args)+1), d.placeholder(len(args)+2))
			args = append(args, r.ID, c)
			if len(args) == 2*deliveryChunk {
				if err := flush(); err != nil {
					return nil, err
				}
			}
		}
	}
	return byCount, flush()
}

// Keyed inserts: records with an Origin, saved at most once per Origin.

// keyed reports whether a record of the batch has an Origin or an
// OrderKey: such a batch is saved with the statements that carry both.
func keyed(records []recordstore.Record) bool {
	for _, r := range records {
		if r.Origin != "" || r.OrderKey != "" {
			return true
		}
	}
	return false
}

// insertKeyed saves a batch in which some records have an Origin, at most
// one row per Origin (the unique index on origin). On the pool the batch is
// first inserted as it is: a handler's first run saves new origins, in the
// one statement a batch without origins costs. When an origin is saved
// already (a rerun), or through a caller's transaction, which a refused
// statement would abort on PostgreSQL, the saved records of the batch's
// origins are read first, and only the others are inserted: a record whose
// origin was saved gets the saved record, and a record whose origin another
// record of the batch has gets that one's. An insert of the same origin
// that commits between the read and the insert makes this one fail with
// the unique violation.
func (s *Store) insertKeyed(ctx context.Context, db executor, d *Dialect, op string, records []recordstore.Record) error {
	if _, pool := db.(*sqlx.DB); pool {
		err := s.insertRows(ctx, db, d, op, &s.q.insertKeyed, records)
		if err == nil || !d.uniqueViolation(err) {
			return err
		}
	}
	saved, err := s.savedOrigins(ctx, db, d, records)
	if err != nil {
		return err
	}
	fresh := make([]recordstore.Record, 0, len(records))
	at := make([]int, 0, len(records)) // the index in records of each fresh record
	first := map[string]int{}          // origin: the index of the record saved for it
	for i, r := range records {
		if r.Origin != "" {
			if rec, ok := saved[r.Origin]; ok {
				reuse(&records[i], rec)
				continue
			}
			if _, dup := first[r.Origin]; dup {
				continue
			}
			first[r.Origin] = i
		}
		fresh, at = append(fresh, r), append(at, i)
	}
	if len(fresh) > 0 {
		if err := s.insertRows(ctx, db, d, op, &s.q.insertKeyed, fresh); err != nil {
			return err
		}
		for j, i := range at {
			records[i].ID = fresh[j].ID
		}
	}
	for i, r := range records {
		if j, ok := first[r.Origin]; ok && j != i {
			reuse(&records[i], records[j])
		}
	}
	return nil
}

// reuse makes r the saved record: its id, UUID, payload and metadata (a
// map of its own).
func reuse(r *recordstore.Record, saved recordstore.Record) {
	r.ID, r.UUID, r.Payload, r.Metadata = saved.ID, saved.UUID, saved.Payload, maps.Clone(saved.Metadata)
}

// savedOrigins reads the saved records of the batch's origins, by origin.
func (s *Store) savedOrigins(ctx context.Context, db executor, d *Dialect, records []recordstore.Record) (map[string]recordstore.Record, error) {
	var origins []any
	seen := map[string]bool{}
	for _, r := range records {
		if r.Origin != "" && !seen[r.Origin] {
			seen[r.Origin] = true
			origins = append(origins, r.Origin)
		}
	}
	saved := make(map[string]recordstore.Record, len(origins))
	err := chunks(origins, func(chunk []any) error {
		rows, err := db.QueryContext(ctx, s.q.savedOrigins+idList(d, 1, len(chunk)), chunk...)
		if err != nil {
			return err
		}
		return scanSaved(rows, saved)
	})
	if err != nil {
		return nil, err
	}
	return saved, nil
}

// scanSaved reads id, uuid, payload, metadata, origin rows into saved.
func scanSaved(rows rowsScanner, saved map[string]recordstore.Record) error {
	defer rows.Close()
	var md, origin string
	for rows.Next() {
		var r recordstore.Record
		if err := rows.Scan(&r.ID, &r.UUID, &r.Payload, &md, &origin); err != nil {
			return err
		}
		if err := completeRecord(&r, md); err != nil {
			return err
		}
		saved[origin] = r
	}
	return rows.Err()
}
