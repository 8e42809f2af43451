package sqlstore

// PendingAfter: the pending records of a topic, a page at a time.

import (
	"context"

	"github.com/wmoutbox/outbox/recordstore"
)

// PendingAfter implements [recordstore.Store]. Each record's metadata is a map of
// its own, which the caller may change.
func (s *Store) PendingAfter(ctx context.Context, topic string, afterID int64, limit int) ([]recordstore.Record, error) {
	return s.PendingAfterBytes(ctx, topic, afterID, limit, 0)
}

// PendingAfterBytes implements [recordstore.ByteBoundedReader]: it stops
// reading the rows, which database/sql streams, once the page holds
// maxBytes. The rows not read are still received and discarded by the
// driver, so a caller should lower limit to what the budget holds.
func (s *Store) PendingAfterBytes(ctx context.Context, topic string, afterID int64, limit, maxBytes int) ([]recordstore.Record, error) {
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, s.q.pendingAfter, topic, afterID, limit)
	if err != nil {
		return nil, s.fail("read pending", err)
	}
	return s.scanPending(rows, topic, min(limit, 1024), maxBytes)
}

// scanPending reads id, uuid, payload, metadata rows of records of one
// topic. Each record's metadata is a map of its own, which the caller may
// change.
func (s *Store) scanPending(rows rowsScanner, topic string, capacity, maxBytes int) ([]recordstore.Record, error) {
	defer rows.Close()
	out := make([]recordstore.Record, 0, capacity)
	var md string
	for bytes := 0; (maxBytes == 0 || bytes < maxBytes) && rows.Next(); bytes += out[len(out)-1].Size() {
		r := recordstore.Record{Topic: topic}
		if err := rows.Scan(&r.ID, &r.UUID, &r.Payload, &md); err != nil {
			return nil, s.fail("read pending", err)
		}
		if err := completeRecord(&r, md); err != nil {
			return nil, s.fail("read pending", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("read pending", err)
	}
	return out, nil
}
