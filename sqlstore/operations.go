package sqlstore

import (
	"database/sql"
	"fmt"

	"github.com/wmoutbox/outbox/recordstore"
)

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
