package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"slices"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.StatusReader = (*Store)(nil)

// PendingStatus implements [recordstore.StatusReader]. It reads the pending
// records, and the pending deliveries, only, through the pending indexes,
// the seen table, a row per topic and consumer seen, and the remote
// consumers of the declarations table.
func (s *Store) PendingStatus(ctx context.Context) ([]recordstore.TopicStatus, error) {
	return s.readStatus(ctx, s.q.pendingStatus, s.q.consumerPendingStatus, false)
}

// Status implements [recordstore.StatusReader]. It reads the whole table, and
// the whole consumers table. The per-consumer Completed counts the
// deliveries the table keeps: on a deleting table, those of records that
// other consumers have still to complete.
func (s *Store) Status(ctx context.Context) ([]recordstore.TopicStatus, error) {
	return s.readStatus(ctx, s.q.status, s.q.consumerStatus, true)
}

func (s *Store) readStatus(ctx context.Context, names, consumers string, full bool) ([]recordstore.TopicStatus, error) {
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	out, err := s.readNames(ctx, db, names, full)
	if err != nil {
		return nil, err
	}
	byName, err := s.readConsumers(ctx, db, consumers, full)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Consumers = byName[out[i].Topic]
	}
	if err := s.addHeldKeys(ctx, db, out); err != nil {
		return nil, err
	}
	if err := s.addRemote(ctx, db, out); err != nil {
		return nil, err
	}
	return s.addSeen(ctx, db, out)
}

func (s *Store) readNames(ctx context.Context, db executor, q string, full bool) ([]recordstore.TopicStatus, error) {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, s.fail("status", err)
	}
	defer rows.Close()
	var out []recordstore.TopicStatus
	for rows.Next() {
		var st recordstore.TopicStatus
		var age sql.NullInt64
		dest := []any{&st.Topic, &st.Pending, &age}
		if full {
			dest = append(dest, &st.Abandoned, &st.Completed)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, s.fail("status", err)
		}
		st.OldestPending = ageOf(age)
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("status", err)
	}
	return out, nil
}

// readConsumers reads the per-consumer counts, by name, in consumer order.
func (s *Store) readConsumers(ctx context.Context, db executor, q string, full bool) (map[string][]recordstore.ConsumerStatus, error) {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, s.fail("status", err)
	}
	defer rows.Close()
	out := map[string][]recordstore.ConsumerStatus{}
	for rows.Next() {
		var name string
		var st recordstore.ConsumerStatus
		var age sql.NullInt64
		dest := []any{&name, &st.Consumer, &st.Pending, &age}
		if full {
			dest = append(dest, &st.Abandoned, &st.Completed)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, s.fail("status", err)
		}
		st.OldestPending = ageOf(age)
		out[name] = append(out[name], st)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("status", err)
	}
	for _, sts := range out {
		slices.SortFunc(sts, func(a, b recordstore.ConsumerStatus) int { return cmp.Compare(a.Consumer, b.Consumer) })
	}
	return out, nil
}

func ageOf(micros sql.NullInt64) time.Duration {
	if micros.Valid && micros.Int64 > 0 {
		return time.Duration(micros.Int64) * time.Microsecond
	}
	return 0
}
