package outbox

// First copies (MiddlewareConfig.CheckFirstCopies off): the publisher remembers
// the records it has just saved, and the first copy of each, per
// consumer, runs without the check.

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// firstCopiesKept is how many records of one topic the publisher
// remembers; an older one is checked as any copy is.
const firstCopiesKept = 1 << 14

// firstCopies are the records of one topic this process published lately
// whose first copy has not reached every local consumer.
type firstCopies struct {
	// on is set once a middleware without CheckFirstCopies is built on the
	// registry: until then the publisher remembers nothing.
	on   atomic.Bool
	mu   sync.Mutex
	byID map[int64]*firstCopy
	ring []int64
	next int
}

type firstCopy struct {
	uuid string
	// taken are the consumers whose first copy ran.
	taken []string
}

// saved remembers the records a publish saved.
func (f *firstCopies) saved(recs []recordstore.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byID == nil {
		f.byID = make(map[int64]*firstCopy, 1024)
		f.ring = make([]int64, firstCopiesKept)
	}
	for _, r := range recs {
		if r.UUID == "" {
			continue
		}
		delete(f.byID, f.ring[f.next])
		f.ring[f.next] = r.ID
		f.next = (f.next + 1) % firstCopiesKept
		f.byID[r.ID] = &firstCopy{uuid: r.UUID}
	}
}

// take reports whether the delivery is the first copy, for its consumer,
// of a record this process published, and counts it taken; consumers is
// how many local consumers the topic has.
func (f *firstCopies) take(d recordstore.Delivery, consumers int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.byID[d.ID]
	if c == nil || c.uuid != d.UUID {
		return false
	}
	for _, t := range c.taken {
		if t == d.Consumer {
			return false
		}
	}
	c.taken = append(c.taken, d.Consumer)
	if len(c.taken) >= consumers {
		delete(f.byID, d.ID)
	}
	return true
}

// skipsCheck reports whether the delivery of a may run without the check
// (MiddlewareConfig.CheckFirstCopies).
func (m *middleware) skipsCheck(a *admission) bool {
	if m.cfg.CheckFirstCopies || a.t.orderKey != "" || a.d.UUID == "" || leases(a.t.store) {
		return false
	}
	return a.t.firstCopies.take(a.d, max(len(a.t.consumers), 1))
}

// leases reports whether the store has a delivery lease, which the check
// takes.
func leases(s recordstore.Store) bool {
	l, ok := s.(interface{ Lease() time.Duration })
	return !ok || l.Lease() > 0
}
