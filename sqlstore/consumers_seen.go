package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.ConsumerRecorder = (*Store)(nil)

// buildSeen builds the statements of the seen table (<table>_seen): one
// row per topic and consumer seen, with when it was first and last seen by
// the database clock.
func (q *queries) buildSeen(f fragments) {
	q.sawConsumer = fmt.Sprintf("INSERT INTO %s (topic, consumer, first_seen_at, last_seen_at) VALUES (%s, %s, %s, %s)%s",
		f.ts, f.p(1), f.p(2), f.clock, f.clock, f.d.upsert("topic, consumer", "last_seen_at = "+f.clock))
	q.consumersSeen = fmt.Sprintf("SELECT topic, consumer, %s FROM %s", f.d.ageMicros("last_seen_at"), f.ts)
	// The records of one topic that wait for more than one consumer never
	// seen; the status counts every other case from what it read already.
	q.unchecked = fmt.Sprintf(`SELECT COUNT(DISTINCT c.record_id) FROM %s c JOIN %s r ON r.id = c.record_id
WHERE r.topic = %s AND %s AND NOT EXISTS (SELECT 1 FROM %s v WHERE v.topic = r.topic AND v.consumer = c.consumer)`,
		f.tc, f.t, f.p(1), cPending, f.ts)
}

// SawConsumer implements [recordstore.ConsumerRecorder] with one upsert of
// the seen table.
func (s *Store) SawConsumer(ctx context.Context, topic, consumer string) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, s.q.sawConsumer, topic, consumer); err != nil {
		return s.fail("record consumer seen", err)
	}
	return nil
}

// seen is when each consumer of each topic was last seen, as an age.
type seen map[string]map[string]time.Duration

// readSeen reads the seen table, which holds a row per topic and consumer
// ever seen: a few rows.
func (s *Store) readSeen(ctx context.Context, db executor) (seen, error) {
	rows, err := db.QueryContext(ctx, s.q.consumersSeen)
	if err != nil {
		return nil, s.fail("status", err)
	}
	defer rows.Close()
	out := seen{}
	for rows.Next() {
		var topic, consumer string
		var age sql.NullInt64
		if err := rows.Scan(&topic, &consumer, &age); err != nil {
			return nil, s.fail("status", err)
		}
		if out[topic] == nil {
			out[topic] = map[string]time.Duration{}
		}
		out[topic][consumer] = ageOf(age)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("status", err)
	}
	return out, nil
}

// addSeen fills the seen fields of the status (see
// [recordstore.TopicStatus.Unchecked]) and adds the topics seen that have
// no records in it. Only a topic with more than one consumer never seen
// that has pending deliveries needs a query, to count its records once.
func (s *Store) addSeen(ctx context.Context, db executor, out []recordstore.TopicStatus) ([]recordstore.TopicStatus, error) {
	byTopic, err := s.readSeen(ctx, db)
	if err != nil {
		return nil, err
	}
	for i := range out {
		st := &out[i]
		if applySeen(st, byTopic[st.Topic]) {
			if err := db.QueryRowContext(ctx, s.q.unchecked, st.Topic).Scan(&st.Unchecked); err != nil {
				return nil, s.fail("status", err)
			}
		}
	}
	n := len(out)
	for topic, consumers := range byTopic {
		if !slices.ContainsFunc(out[:n], func(st recordstore.TopicStatus) bool { return st.Topic == topic }) {
			st := recordstore.TopicStatus{Topic: topic}
			applySeen(&st, consumers)
			out = append(out, st)
		}
	}
	if len(out) > n {
		slices.SortFunc(out, func(a, b recordstore.TopicStatus) int { return strings.Compare(a.Topic, b.Topic) })
	}
	return out, nil
}

// applySeen fills the seen fields of a topic's status from when its
// consumers were last seen. It reports whether st.Unchecked is left for the
// caller to count: when the topic was seen and more than one of its
// consumers with pending deliveries was not, since their records may
// overlap.
func applySeen(st *recordstore.TopicStatus, consumers map[string]time.Duration) (count bool) {
	unseen := 0
	for _, age := range consumers {
		if !st.Seen || age < st.SinceSeen {
			st.Seen, st.SinceSeen = true, age
		}
	}
	if !st.Seen {
		// No receiver ever checked a record of the topic: every pending
		// record waits for one.
		st.Unchecked = st.Pending
	}
	for j := range st.Consumers {
		cs := &st.Consumers[j]
		cs.SinceSeen, cs.Seen = consumers[cs.Consumer]
		if !cs.Seen && cs.Pending > 0 {
			cs.Unchecked = cs.Pending
			unseen++
			if st.Seen {
				// One consumer never seen: a record has one delivery
				// per consumer, so its pending deliveries are the
				// records that wait for it.
				st.Unchecked = cs.Pending
			}
		}
	}
	return st.Seen && unseen > 1
}

// ConsumersSeen reads how long ago each consumer of each topic was last
// seen ([recordstore.ConsumerRecorder]), by topic then consumer, from the
// seen table: a row per pair ever seen. The status tells it only of
// the consumers with pending deliveries; the dashboard also shows the
// consumers that have only abandoned ones.
func (o *Operator) ConsumersSeen(ctx context.Context) (map[string]map[string]time.Duration, error) {
	db, err := o.s.pool()
	if err != nil {
		return nil, err
	}
	return o.s.readSeen(ctx, db)
}
