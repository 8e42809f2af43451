package sqlstore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
)

// The row scanners every dialect shares.

// rowsScanner is what the scanners need of *sql.Rows.
type rowsScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// scanIDList reads a column of ids.
func scanIDList(rows rowsScanner, into []int64) ([]int64, error) {
	defer rows.Close()
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return into, err
		}
		into = append(into, id)
	}
	return into, rows.Err()
}

// scanRecords reads id, topic, uuid, payload, metadata rows.
func (s *Store) scanRecords(rows rowsScanner, op string, maxBytes int) ([]recordstore.Record, error) {
	defer rows.Close()
	var out []recordstore.Record
	var md string
	for bytes := 0; (maxBytes == 0 || bytes < maxBytes) && rows.Next(); bytes += out[len(out)-1].Size() {
		var r recordstore.Record
		if err := rows.Scan(&r.ID, &r.Topic, &r.UUID, &r.Payload, &md); err != nil {
			return nil, s.fail(op, err)
		}
		if err := completeRecord(&r, md); err != nil {
			return nil, s.fail(op, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(op, err)
	}
	return out, nil
}

// completeRecord decodes the metadata of a record read from a row, and
// gives it an empty payload rather than nil, as it was published.
func completeRecord(r *recordstore.Record, md string) error {
	var err error
	if r.Metadata, err = decodeMetadata(md); err != nil {
		return fmt.Errorf("record %d: %w", r.ID, err)
	}
	if r.Payload == nil {
		r.Payload = []byte{}
	}
	return nil
}

// scanInfos reads the rows of q.list and q.get (operatorColumns),
// until their payloads and metadata reach maxBytes (0: no bound).
func (s *Store) scanInfos(rows rowsScanner, maxBytes int) ([]recordstore.RecordInfo, error) {
	defer rows.Close()
	var out []recordstore.RecordInfo
	for bytes := 0; (maxBytes == 0 || bytes < maxBytes) && rows.Next(); bytes += out[len(out)-1].Size() {
		var r recordstore.RecordInfo
		var md, state string
		var age, sent int64
		var kind int
		if err := rows.Scan(&r.ID, &r.Topic, &r.UUID, &r.Payload, &md, &state, &r.Attempts, &r.LastError, &age, &sent, &kind); err != nil {
			return nil, s.fail("list", err)
		}
		var err error
		if r.Metadata, err = decodeMetadata(md); err != nil {
			return nil, s.fail("list", fmt.Errorf("record %d: %w", r.ID, err))
		}
		r.State, r.Age, r.SinceSent = State(state), time.Duration(age)*time.Microsecond, time.Duration(sent)*time.Microsecond
		r.Resent, r.Due = kind == sentAgain, kind == sentMadeDue
		if r.Due {
			r.SinceSent = 0
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("list", err)
	}
	return out, nil
}

// scanDeliveryInfos reads the rows of q.listDeliveriesByRecord into the
// records of infos, found by id through at.
func (s *Store) scanDeliveryInfos(rows rowsScanner, infos []recordstore.RecordInfo, at map[int64]int) error {
	defer rows.Close()
	for rows.Next() {
		var id int64
		var di recordstore.DeliveryInfo
		var state string
		if err := rows.Scan(&id, &di.Consumer, &state, &di.Attempts, &di.LastError); err != nil {
			return s.fail("list deliveries", err)
		}
		di.State = State(state)
		r := &infos[at[id]]
		r.Deliveries = append(r.Deliveries, di)
	}
	if err := rows.Err(); err != nil {
		return s.fail("list deliveries", err)
	}
	return nil
}

func decodeMetadata(s string) (message.Metadata, error) {
	md := message.Metadata{}
	if s == "" || s == "{}" {
		return md, nil
	}
	if err := json.Unmarshal([]byte(s), &md); err != nil {
		return nil, fmt.Errorf("metadata is not a JSON object of strings: %w", err)
	}
	return md, nil
}
