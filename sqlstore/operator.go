package sqlstore

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// Operator runs the queries of operators' tools (cmd/outboxctl, the
// outboxui dashboard) on a store's table: listing, reading and browsing
// records, and making them due. No [recordstore] interface needs them, so
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

// listQuery is the statement of List for a state.
func (s *Store) listQuery(st State) (string, error) {
	if q, ok := s.q.list[st]; ok {
		return q, nil
	}
	if st == Completed {
		return "", fmt.Errorf("%w: a deleting table keeps no completed records", ErrInvalidConfig)
	}
	return "", fmt.Errorf("%w: unknown record state %q (pending, abandoned or completed)", ErrInvalidConfig, st)
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

// List returns up to limit records in the state whose id is greater than
// afterID, ordered by id.
func (o *Operator) List(ctx context.Context, st State, afterID int64, limit int) ([]recordstore.RecordInfo, error) {
	return o.ListBytes(ctx, st, afterID, limit, 0)
}

// ListBytes is List that also stops at the record whose payload and
// metadata bring the page to maxBytes (0: no bound), so that a page of
// large payloads holds about maxBytes rather than limit payloads.
func (o *Operator) ListBytes(ctx context.Context, st State, afterID int64, limit, maxBytes int) ([]recordstore.RecordInfo, error) {
	s := o.s
	query, err := s.listQuery(st)
	if err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d must be positive", ErrInvalidConfig, limit)
	}
	db, d, err := s.bound(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, query, afterID, limit)
	if err != nil {
		return nil, s.fail("list", err)
	}
	infos, err := s.scanInfos(rows, maxBytes)
	if err != nil {
		return nil, err
	}
	return infos, s.addDeliveries(ctx, db, d, infos)
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
