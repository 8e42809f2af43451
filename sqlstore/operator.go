package sqlstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// Operator runs the queries of operators' tools (cmd/outboxctl, the
// outboxui dashboard) on a store's table: listing and reading records, and
// making them due. No [recordstore] interface needs them, so
// they are kept off [Store]. Get one with [Store.Operator].
type Operator struct {
	s *Store
}

// Operator returns the operator's queries on the store's table.
func (s *Store) Operator() *Operator { return &Operator{s: s} }

// State is where a record, or a delivery, is in its life, for the
// operator's queries; it is [recordstore.State].
type State = recordstore.State

// The states a record can be in.
const (
	Pending   = recordstore.Pending
	Abandoned = recordstore.Abandoned
	Completed = recordstore.Completed
)

// addDeliveries fills in the deliveries of the records.
func (s *Store) addDeliveries(ctx context.Context, db *sqlx.DB, d *Dialect, infos []recordstore.RecordInfo) error {
	at := make(map[int64]int, len(infos))
	for i, r := range infos {
		at[r.ID] = i
	}
	ids := make([]any, len(infos))
	for i, r := range infos {
		ids[i] = r.ID
	}
	return chunks(ids, func(chunk []any) error {
		rows, err := db.QueryContext(ctx, s.q.listDeliveriesByRecord+idList(d, 1, len(chunk))+" ORDER BY record_id, consumer", chunk...)
		if err != nil {
			return s.fail("list deliveries", err)
		}
		return s.scanDeliveryInfos(rows, infos, at)
	})
}

// The kinds of last send a record can have, as sendKind reads them.
const (
	sentWithPublish = 0 // only by the publish that saved it
	sentAgain       = 1 // resent since
	sentMadeDue     = 2 // made due, and not sent since
)

// sendKind tells the kinds of last send apart. A record made due has
// dueLongAgo as its send time; dueBefore is a day later, so that every
// session time zone reads the marker as before it.
func sendKind() string {
	return fmt.Sprintf("CASE WHEN last_sent_at IS NULL THEN %d WHEN last_sent_at < '%s' THEN %d ELSE %d END",
		sentWithPublish, dueBefore, sentMadeDue, sentAgain)
}

const dueBefore = "2000-01-02"

// RecordFilter selects the records [Operator.List] reads.
type RecordFilter struct {
	// Topic, when set, keeps the records of this topic.
	Topic string
	// Consumer, when set, keeps the records of Topic in which this
	// consumer's delivery is in State: pending for it (whatever the
	// others'), or abandoned by it (the record pending for others, or
	// abandoned). It needs a Topic.
	Consumer string
	// State is Pending, Abandoned or, on a table that keeps completed
	// records (Mark), Completed. Defaults to Pending.
	State State
}

// List returns up to limit records of the filter whose id is greater than
// afterID, ordered by id, with their deliveries: a page of outboxctl list
// or of the dashboard's records. With maxBytes > 0 the page also ends at
// the record whose payload and metadata bring it to maxBytes, so that a
// page of large payloads holds about maxBytes rather than limit payloads.
//
// A topic's pending or abandoned records are read through the table's
// indexes only (the topic's pending or abandoned index, the consumers
// table's pending index and primary key), so that a page costs the same
// however many records the table keeps. Completed records, which no index
// keeps by topic, are listed across topics only.
func (o *Operator) List(ctx context.Context, f RecordFilter, afterID int64, limit, maxBytes int) ([]recordstore.RecordInfo, error) {
	s := o.s
	if f.State == "" {
		f.State = Pending
	}
	if err := s.checkFilter(f); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d must be positive", ErrInvalidConfig, limit)
	}
	db, d, err := s.bound(ctx)
	if err != nil {
		return nil, err
	}
	l := &s.q.list
	var infos []recordstore.RecordInfo
	switch {
	case f.Topic == "":
		infos, err = s.listPage(ctx, db, maxBytes, l.allTopics[f.State], afterID, limit)
	case f.Consumer == "":
		infos, err = s.listPage(ctx, db, maxBytes, l.byTopic[f.State], f.Topic, afterID, limit)
	case f.State == Pending:
		infos, err = s.listPage(ctx, db, maxBytes, l.byConsumer, f.Consumer, f.Topic, afterID, limit)
	default:
		// A consumer's abandoned delivery is in a pending record (others
		// have still to complete it) or an abandoned one: a page of each,
		// merged by id.
		var other []recordstore.RecordInfo
		if infos, err = s.listPage(ctx, db, maxBytes, l.abandonedOf[Pending], f.Topic, afterID, f.Consumer, limit); err == nil {
			other, err = s.listPage(ctx, db, maxBytes, l.abandonedOf[Abandoned], f.Topic, afterID, f.Consumer, limit)
		}
		infos = append(infos, other...)
		slices.SortFunc(infos, func(a, b recordstore.RecordInfo) int { return cmp.Compare(a.ID, b.ID) })
		infos = upToBytes(infos[:min(limit, len(infos))], maxBytes)
	}
	if err != nil {
		return nil, err
	}
	return infos, s.addDeliveries(ctx, db, d, infos)
}

// checkFilter refuses a filter that List has no statement for.
func (s *Store) checkFilter(f RecordFilter) error {
	switch {
	case f.State != Pending && f.State != Abandoned && f.State != Completed:
		return fmt.Errorf("%w: unknown record state %q (pending, abandoned or completed)", ErrInvalidConfig, f.State)
	case f.State == Completed && !s.q.mark:
		return fmt.Errorf("%w: a deleting table keeps no completed records", ErrInvalidConfig)
	case f.State == Completed && f.Topic != "":
		return fmt.Errorf("%w: completed records are listed across topics: no index keeps them by topic", ErrInvalidConfig)
	case f.Consumer != "" && f.Topic == "":
		return fmt.Errorf("%w: a consumer's records are listed by topic: set the filter's Topic", ErrInvalidConfig)
	}
	return nil
}

// listPage runs one of List's statements and reads its page.
func (s *Store) listPage(ctx context.Context, db executor, maxBytes int, q string, args ...any) ([]recordstore.RecordInfo, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, s.fail("list", err)
	}
	return s.scanInfos(rows, maxBytes)
}

// upToBytes is infos up to the record whose payload and metadata bring
// them to maxBytes (0: all of them), as scanInfos ends a page.
func upToBytes(infos []recordstore.RecordInfo, maxBytes int) []recordstore.RecordInfo {
	if maxBytes == 0 {
		return infos
	}
	n := 0
	for i := range infos {
		if n += infos[i].Size(); n >= maxBytes {
			return infos[:i+1]
		}
	}
	return infos
}

// Get returns one record, or an error wrapping [ErrRecordNotFound].
func (o *Operator) Get(ctx context.Context, id int64) (recordstore.RecordInfo, error) {
	s := o.s
	db, d, err := s.bound(ctx)
	if err != nil {
		return recordstore.RecordInfo{}, err
	}
	rows, err := db.QueryContext(ctx, s.q.get, id)
	if err != nil {
		return recordstore.RecordInfo{}, s.fail("get", err)
	}
	infos, err := s.scanInfos(rows, 0)
	if err != nil {
		return recordstore.RecordInfo{}, err
	}
	if len(infos) == 0 {
		return recordstore.RecordInfo{}, &TableError{Table: s.table, Op: "get", Err: fmt.Errorf("record %d: %w", id, ErrRecordNotFound)}
	}
	if err := s.addDeliveries(ctx, db, d, infos); err != nil {
		return recordstore.RecordInfo{}, err
	}
	return infos[0], nil
}

// dueLongAgo is a send time every database reads from the same text and that
// is older than any resend age.
const dueLongAgo = "2000-01-01 00:00:00"

// MakeDue marks up to limit pending records with an id greater than afterID
// as last sent long ago, so that the service's outbox.StaleResubmitter
// sends them at its next round, and returns their ids in order. With dryRun
// it only returns the ids.
func (o *Operator) MakeDue(ctx context.Context, afterID int64, limit int, dryRun bool) ([]int64, error) {
	s := o.s
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d must be positive", ErrInvalidConfig, limit)
	}
	db, d, err := s.bound(ctx)
	if err != nil {
		return nil, err
	}
	var ids []int64
	err = s.inTx(ctx, db, "make due", func(tx executor) error {
		rows, err := tx.QueryContext(ctx, s.q.makeDueSelect, afterID, limit)
		if err != nil {
			return s.fail("make due", err)
		}
		if ids, err = scanIDList(rows, nil); err != nil {
			return s.fail("make due", err)
		}
		if dryRun || len(ids) == 0 {
			return nil
		}
		args := []any{dueLongAgo}
		for _, id := range ids {
			args = append(args, id)
		}
		if _, err := tx.ExecContext(ctx, s.q.makeDueStamp+idList(d, 2, len(ids)), args...); err != nil {
			return s.fail("make due", err)
		}
		return nil
	})
	return ids, err
}

// RequeueLater makes an abandoned record pending again with its attempts
// reset, like [Store.Requeue], but leaves the sending to the
// service: the record is due at once for its outbox.StaleResubmitter, and
// its next startup replay sends it too. A record that is not abandoned is
// an error wrapping [recordstore.ErrNotAbandoned].
func (o *Operator) RequeueLater(ctx context.Context, id int64) error {
	s := o.s
	if _, err := s.Requeue(ctx, id); err != nil {
		return err
	}
	db, _, err := s.bound(ctx)
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, s.q.requeueLater, dueLongAgo, id); err != nil {
		return s.fail("requeue", err)
	}
	return nil
}
