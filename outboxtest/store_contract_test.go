package outboxtest

import (
	"testing"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore/storetest"
)

func TestStoreContract(t *testing.T) {
	t.Parallel()
	storetest.RunContract(t, storetest.Contract{
		New: func(t *testing.T, opts storetest.StoreOptions) recordstore.Store {
			return NewStore(StoreConfig{DeleteCompleted: opts.Completion == storetest.Delete, Lease: opts.Lease})
		},
		Inspector: inspector{},
	})
}

// inspector is the contract suite's view of the store's internals.
type inspector struct{}

func memStore(t testing.TB, store recordstore.Store) *Store {
	t.Helper()
	s, ok := store.(*Store)
	if !ok {
		t.Fatalf("a %T is not an *outboxtest.Store", store)
	}
	return s
}

func (inspector) IDs(t testing.TB, store recordstore.Store) map[string]int64 {
	s := memStore(t, store)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.byID))
	for id, r := range s.byID {
		out[r.rec.UUID] = id
	}
	return out
}

func (inspector) Record(t testing.TB, store recordstore.Store, id int64) (storetest.Stored, bool) {
	s := memStore(t, store)
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.byID[id]
	if r == nil {
		return storetest.Stored{}, false
	}
	return storetest.Stored{
		State:       storetest.State(stateOf(r.completed.IsZero(), r.abandoned.IsZero())),
		Attempts:    r.attempt.attempts,
		LastError:   r.attempt.lastError,
		CompletedAt: r.completed,
	}, true
}

func (inspector) Deliveries(t testing.TB, store recordstore.Store, id int64) []storetest.StoredDelivery {
	s := memStore(t, store)
	info, found := s.Record(id)
	if !found || info.Gone {
		return nil // the deliveries go with their record
	}
	var out []storetest.StoredDelivery
	for _, d := range info.Deliveries {
		out = append(out, storetest.StoredDelivery{Consumer: d.Consumer, State: storetest.State(d.State), Attempts: d.Attempts, LastError: d.LastError})
	}
	return out
}

func (inspector) Remove(t testing.TB, store recordstore.Store, id int64) {
	s := memStore(t, store)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remove(id)
}

func (inspector) Backdate(t testing.TB, store recordstore.Store, m storetest.Moment, ids ...int64) {
	s := memStore(t, store)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(ids) == 0 {
		ids = s.order
	}
	for _, id := range ids {
		r := s.byID[id]
		if r == nil {
			continue
		}
		switch m {
		case storetest.SavedAt:
			r.created = storetest.LongAgo
		case storetest.SentAt:
			r.lastSent = storetest.LongAgo
		case storetest.DueAt:
			r.attempt.due = storetest.LongAgo
			for _, d := range r.deliveries {
				d.due = storetest.LongAgo
			}
		case storetest.CompletedAt:
			if !r.completed.IsZero() {
				r.completed = storetest.LongAgo
			}
		default:
			t.Fatalf("unknown moment %d", m)
		}
	}
}

func (inspector) Now(t testing.TB, store recordstore.Store) time.Time {
	return memStore(t, store).now()
}
