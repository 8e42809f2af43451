package outboxtest

import (
	"slices"

	"github.com/wmoutbox/outbox/recordstore"
)

// State is where a record, or one consumer's delivery of it, is in its
// life; it is [recordstore.State].
type State = recordstore.State

// The states of a record or a delivery.
const (
	// Pending waits for a consumer to complete it.
	Pending = recordstore.Pending
	// Completed was completed by its consumer, or by every declared
	// consumer; on a store that deletes completed records it is gone.
	Completed = recordstore.Completed
	// Abandoned failed its last allowed attempt
	// (outbox.MiddlewareConfig.MaxAttempts).
	Abandoned = recordstore.Abandoned
)

// Records returns every record saved for the topic, in id order, whatever
// became of it: also the ones the store has since deleted or cleaned.
func (s *Store) Records(topic string) []recordstore.RecordInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []recordstore.RecordInfo
	for _, r := range s.all {
		if r.rec.Topic == topic {
			out = append(out, r.info())
		}
	}
	return out
}

// Record returns the record with the id, whatever became of it; false when
// the store never saved it.
func (s *Store) Record(id int64) (recordstore.RecordInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, found := slices.BinarySearchFunc(s.all, id, func(r *record, id int64) int {
		switch {
		case r.rec.ID < id:
			return -1
		case r.rec.ID > id:
			return 1
		}
		return 0
	})
	if !found {
		return recordstore.RecordInfo{}, false
	}
	return s.all[i].info(), true
}

// topics returns the topics the store saved records of, sorted.
func (s *Store) topics() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.all {
		if !slices.Contains(out, r.rec.Topic) {
			out = append(out, r.rec.Topic)
		}
	}
	slices.Sort(out)
	return out
}

func (r *record) info() recordstore.RecordInfo {
	info := recordstore.RecordInfo{
		Record:      copyRecord(r.rec),
		State:       stateOf(r.completed.IsZero(), r.abandoned.IsZero()),
		Attempts:    r.attempt.attempts,
		LastError:   r.attempt.lastError,
		CompletedBy: r.completedBy,
		Gone:        r.gone,
	}
	info.Consumers = slices.Clone(r.consumers)
	for _, c := range slices.Sorted(slices.Values(r.consumers)) {
		dl := r.deliveries[c]
		info.Deliveries = append(info.Deliveries, recordstore.DeliveryInfo{
			Consumer:  c,
			State:     stateOf(dl.completed.IsZero(), dl.abandoned.IsZero()),
			Attempts:  dl.attempts,
			LastError: dl.lastError,
		})
	}
	return info
}

func stateOf(notCompleted, notAbandoned bool) State {
	switch {
	case !notAbandoned:
		return Abandoned
	case !notCompleted:
		return Completed
	}
	return Pending
}
