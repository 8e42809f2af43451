package sqlstore

import (
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// pendingCond selects pending records: not completed (on a marking table)
// and not abandoned.
func (s *Store) pendingCond() string {
	if s.mode == Mark {
		return "processed_at IS NULL"
	}
	return "abandoned_at IS NULL"
}

// micros is a duration as the integer argument of [Dialect.ago].
func micros(d time.Duration) int64 { return d.Microseconds() }

// idList is "(p1, p2, …)" for n ids starting at placeholder first.
func idList(d Dialect, first, n int) string {
	var b strings.Builder
	b.WriteByte('(')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(d.placeholder(first + i))
	}
	b.WriteByte(')')
	return b.String()
}

// scanRecords reads id, topic, uuid, payload, metadata rows.
func (s *Store) scanRecords(rows *sql.Rows, op string) ([]recordstore.Record, error) {
	defer rows.Close()
	var out []recordstore.Record
	var md string
	for rows.Next() {
		var r recordstore.Record
		if err := rows.Scan(&r.ID, &r.Topic, &r.UUID, &r.Payload, &md); err != nil {
			return nil, s.fail(op, err)
		}
		var err error
		if r.Metadata, err = decodeMetadata(md); err != nil {
			return nil, s.fail(op, fmt.Errorf("record %d: %w", r.ID, err))
		}
		if r.Payload == nil {
			r.Payload = []byte{}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(op, err)
	}
	return out, nil
}
