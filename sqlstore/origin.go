package sqlstore

// Keyed inserts: records with an Origin, saved at most once per Origin.

import (
	"context"
	"maps"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// keyed reports whether a record of the batch has an Origin.
func keyed(records []recordstore.Record) bool {
	for _, r := range records {
		if r.Origin != "" {
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
func (s *Store) insertKeyed(ctx context.Context, db executor, d Dialect, op string, records []recordstore.Record) error {
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
func (s *Store) savedOrigins(ctx context.Context, db executor, d Dialect, records []recordstore.Record) (map[string]recordstore.Record, error) {
	var origins []any
	seen := map[string]bool{}
	for _, r := range records {
		if r.Origin != "" && !seen[r.Origin] {
			seen[r.Origin] = true
			origins = append(origins, r.Origin)
		}
	}
	saved := make(map[string]recordstore.Record, len(origins))
	for start := 0; start < len(origins); start += stampChunk {
		chunk := origins[start:min(start+stampChunk, len(origins))]
		rows, err := db.QueryContext(ctx, s.q.savedOrigins+idList(d, 1, len(chunk)), chunk...)
		if err != nil {
			return nil, err
		}
		if err := scanSaved(rows, saved); err != nil {
			return nil, err
		}
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
