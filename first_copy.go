package outbox

// First copies (MiddlewareConfig.CheckFirstCopies off): the publisher remembers
// the records it has just saved, and the first copy of each, per
// consumer, runs without the check.
//
// On a topic with an order key the publisher also asks the store, right
// after the insert, which earlier record of its key each new record waits
// for (recordstore.KeyPredecessors). The first copy of a record that waits
// for none, or for a record this consumer completed here, runs without the
// check: the earlier records of its key are done. When that record's
// completion is on its way, the copy waits for it to commit first, so that
// a crash cannot make the earlier record run again after this one. Any
// other copy is checked, and held as ordering.go says.

import (
	"context"
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
	// before is, on a topic with an order key, the earlier record of its
	// key the record waited for when it was saved; 0 for none.
	before int64
}

// saved remembers the records a publish saved. On an ordered topic before
// names, by id, the earlier record of its key each waits for, and a
// record it does not name is not remembered: its first copy is checked.
// before is nil on a topic without a key.
func (f *firstCopies) saved(recs []recordstore.Record, before map[int64]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byID == nil {
		f.byID = make(map[int64]*firstCopy, 1024)
		f.ring = make([]int64, firstCopiesKept)
	}
	for _, r := range recs {
		b, ok := before[r.ID]
		if r.UUID == "" || before != nil && !ok {
			continue
		}
		delete(f.byID, f.ring[f.next])
		f.ring[f.next] = r.ID
		f.next = (f.next + 1) % firstCopiesKept
		f.byID[r.ID] = &firstCopy{uuid: r.UUID, before: b}
	}
}

// take reports whether the delivery is the first copy, for its consumer,
// of a record this process published, and counts it taken; consumers is
// how many local consumers the topic has.
func (f *firstCopies) take(d recordstore.Delivery, consumers int) bool {
	_, ok := f.takeBefore(d, consumers)
	return ok
}

// takeBefore is take, and also returns the earlier record of its key the
// record waited for when it was saved.
func (f *firstCopies) takeBefore(d recordstore.Delivery, consumers int) (before int64, first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.byID[d.ID]
	if c == nil || c.uuid != d.UUID {
		return 0, false
	}
	for _, t := range c.taken {
		if t == d.Consumer {
			return 0, false
		}
	}
	c.taken = append(c.taken, d.Consumer)
	if len(c.taken) >= consumers {
		delete(f.byID, d.ID)
	}
	return c.before, true
}

// skipsCheck reports whether the delivery of a may run without the check
// (MiddlewareConfig.CheckFirstCopies).
func (m *middleware) skipsCheck(ctx context.Context, a *admission) bool {
	if m.cfg.CheckFirstCopies || a.d.UUID == "" || leases(a.t.store) {
		return false
	}
	consumers := max(len(a.t.consumers), 1)
	if a.t.orderKey == "" {
		return a.t.firstCopies.take(a.d, consumers)
	}
	before, first := a.t.firstCopies.takeBefore(a.d, consumers)
	if !first {
		return false
	}
	if before == 0 {
		a.unchecked = true
		return true
	}
	if c, ok := a.t.completing.Load(completingKey{id: before, consumer: a.d.Consumer}); ok {
		// The earlier record's handler ran here and its completion is on
		// its way: this one runs once it committed, never before, so that
		// a crash cannot make the earlier record run again after it.
		c := c.(*completion)
		select {
		case <-c.done:
		case <-ctx.Done():
			return false
		}
		a.unchecked = c.ok
		return c.ok
	}
	a.unchecked = a.t.holds.completed(heldKey{a.d.Consumer, before})
	return a.unchecked
}

// leases reports whether the store has a delivery lease, which the check
// takes.
func leases(s recordstore.Store) bool {
	l, ok := s.(interface{ Lease() time.Duration })
	return !ok || l.Lease() > 0
}
