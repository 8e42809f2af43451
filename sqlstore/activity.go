package sqlstore

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// The window of [Operator.Activity]: the last hour, in one-minute steps.
const (
	ActivityWindow = time.Hour
	ActivityStep   = time.Minute
	activitySteps  = int(ActivityWindow / ActivityStep)
)

// Activity is what the records' own timestamps tell of one topic's last
// hour, so that it survives the service's restarts.
type Activity struct {
	Topic string
	// Backlog is how many records were pending at each step of the last
	// [ActivityWindow], [ActivityStep] apart, oldest first; the last is
	// now. On a table that deletes completed records, the records
	// completed since are gone, and the backlog counts only those left.
	Backlog []int64
	// Completed counts the records completed in the window (zero on a
	// deleting table); Resent those of them sent again after their
	// publish (by a replay or a stale resubmit round), Failed those whose
	// handling failed at least once.
	Completed, Resent, Failed int64
	// Abandoned counts every abandoned record of the topic, and
	// AbandonedDeliveries their deliveries by consumer, for records saved
	// with consumers.
	Abandoned           int64
	AbandonedDeliveries map[string]int64
}

// buildActivity builds the statements of Activity. Each reads through an
// index: the pending records through the pending index, the records
// completed in the window through the processed index, the abandoned ones
// through the abandoned index, their deliveries by primary key.
func (b *dashboardQueries) buildActivity(f fragments) {
	t, tc := f.t, f.tc
	bucket := func(col string) string {
		a := f.d.ageMicros(col)
		step := ActivityStep.Microseconds()
		// (a - a % step) / step is an exact integer on every database,
		// without a dialect's integer division.
		return fmt.Sprintf("CASE WHEN %s >= %d THEN %d WHEN %s < 0 THEN 0 ELSE (%s - %s %% %d) / %d END",
			a, int64(activitySteps+1)*step, activitySteps+1, a, a, a, step, step)
	}
	b.pendingCreated = fmt.Sprintf("SELECT topic, %s, 0, COUNT(*), 0, 0 FROM %s WHERE %s GROUP BY topic, 2",
		bucket("created_at"), t, f.pending)
	if f.mark {
		failed := fmt.Sprintf("CASE WHEN attempts > 0 OR (consumers > 0 AND EXISTS (SELECT 1 FROM %s c WHERE c.record_id = r.id AND c.attempts > 0)) THEN 1 ELSE 0 END", tc)
		b.completedWindow = fmt.Sprintf(`SELECT topic, %s, %s, COUNT(*), SUM(CASE WHEN %s = %d THEN 1 ELSE 0 END), SUM(%s)
FROM %s r WHERE processed_at > %s AND abandoned_at IS NULL GROUP BY topic, 2, 3`,
			bucket("created_at"), bucket("processed_at"), sendKind(), sentAgain, failed, t, f.d.agoFixed(ActivityWindow))
	}
	b.abandonedWindow = fmt.Sprintf("SELECT topic, %s, %s, COUNT(*), 0, 0 FROM %s WHERE abandoned_at IS NOT NULL GROUP BY topic, 2, 3",
		bucket("created_at"), bucket("abandoned_at"), t)
	b.abandonedConsumers = fmt.Sprintf(`SELECT r.topic, c.consumer, COUNT(*) FROM %s r JOIN %s c ON c.record_id = r.id
WHERE r.abandoned_at IS NOT NULL AND c.abandoned_at IS NOT NULL GROUP BY r.topic, c.consumer`, t, tc)
}

// Activity reads the last hour of every topic with records pending,
// completed in the window, or abandoned, in topic order. It reads the
// pending and abandoned records and those completed in the window, never
// the whole table.
func (o *Operator) Activity(ctx context.Context) ([]Activity, error) {
	s := o.s
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	b := &s.q.dashboard
	byTopic := map[string]*Activity{}
	var order []string
	get := func(topic string) *Activity {
		a, ok := byTopic[topic]
		if !ok {
			a = &Activity{Topic: topic, Backlog: make([]int64, activitySteps+1)}
			byTopic[topic] = a
			order = append(order, topic)
		}
		return a
	}
	// pendingNow stands for the end bucket of a record still pending: it
	// is in the backlog at every point from its creation on.
	const pendingNow = -1
	read := func(q string, ended func(a *Activity, n int64)) error {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			return s.fail("activity", err)
		}
		defer rows.Close()
		for rows.Next() {
			var topic string
			// The buckets are floats: MySQL's division is decimal.
			var created, end float64
			var n, resent, failed int64
			if err := rows.Scan(&topic, &created, &end, &n, &resent, &failed); err != nil {
				return s.fail("activity", err)
			}
			a := get(topic)
			if ended == nil {
				end = pendingNow
			} else {
				ended(a, n)
			}
			a.Resent += resent
			a.Failed += failed
			// The point k, (steps-k) steps ago, counts a record created
			// at or before it and not ended by then.
			for k := max(0, activitySteps-int(created)); k <= activitySteps-int(end)-1 && k <= activitySteps; k++ {
				a.Backlog[k] += n
			}
		}
		if err := rows.Err(); err != nil {
			return s.fail("activity", err)
		}
		return nil
	}
	if err := read(b.pendingCreated, nil); err != nil {
		return nil, err
	}
	if b.completedWindow != "" {
		if err := read(b.completedWindow, func(a *Activity, n int64) { a.Completed += n }); err != nil {
			return nil, err
		}
	}
	if err := read(b.abandonedWindow, func(a *Activity, n int64) { a.Abandoned += n }); err != nil {
		return nil, err
	}
	if err := s.readAbandonedDeliveries(ctx, db, get); err != nil {
		return nil, err
	}
	slices.Sort(order)
	out := make([]Activity, 0, len(order))
	for _, topic := range order {
		out = append(out, *byTopic[topic])
	}
	return out, nil
}

func (s *Store) readAbandonedDeliveries(ctx context.Context, db executor, get func(string) *Activity) error {
	rows, err := db.QueryContext(ctx, s.q.dashboard.abandonedConsumers)
	if err != nil {
		return s.fail("activity", err)
	}
	defer rows.Close()
	for rows.Next() {
		var topic, consumer string
		var n int64
		if err := rows.Scan(&topic, &consumer, &n); err != nil {
			return s.fail("activity", err)
		}
		a := get(topic)
		if a.AbandonedDeliveries == nil {
			a.AbandonedDeliveries = map[string]int64{}
		}
		a.AbandonedDeliveries[consumer] = n
	}
	if err := rows.Err(); err != nil {
		return s.fail("activity", err)
	}
	return nil
}
