package outbox

// First copies (MiddlewareConfig.CheckFirstCopies off): the publisher remembers
// the records it has just saved, and the first copy of each, per
// consumer, runs without the check.
//
// On a topic with an order key the publisher also asks the store, right
// after the insert, which earlier record of its key each new record waits
// for (recordstore.KeyPredecessors). The first copy of a record that waits
// for none, or for a record this consumer completed here, runs without the
// check: the earlier records of its key are done. When that record is on
// its way here (its first copy not yet delivered, its handler running or
// its completion not yet committed), the copy waits for it off the
// handler's path (ordering.go's park) and is sent again once it completed,
// so that a crash cannot make the earlier record run again after this one
// and the subscription goes on meanwhile. Any other copy is checked, and
// held as ordering.go says.

import (
	"context"
	"slices"
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
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.first(d)
	if c == nil {
		return false
	}
	c.taken = append(c.taken, d.Consumer)
	if len(c.taken) >= consumers {
		delete(f.byID, d.ID)
	}
	return true
}

// peek reports whether the delivery would be a first copy, and the
// earlier record of its key the record waited for when it was saved,
// without counting it taken.
func (f *firstCopies) peek(d recordstore.Delivery) (before int64, first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.first(d)
	if c == nil {
		return 0, false
	}
	return c.before, true
}

// coming reports whether the first copy of record id, which this process
// published, has yet to reach consumer.
func (f *firstCopies) coming(id int64, consumer string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.byID[id]
	return c != nil && !slices.Contains(c.taken, consumer)
}

// first is the record of a delivery that is its consumer's first copy;
// nil for any other. The caller holds mu.
func (f *firstCopies) first(d recordstore.Delivery) *firstCopy {
	c := f.byID[d.ID]
	if c == nil || c.uuid != d.UUID || slices.Contains(c.taken, d.Consumer) {
		return nil
	}
	return c
}

// skipsCheck reports whether the delivery of a may run without the check
// (MiddlewareConfig.CheckFirstCopies). On a topic with an order key it
// returns instead, as before, the earlier record of the key that is on its
// way here and that the copy is to wait for off the handler's path (park).
func (m *middleware) skipsCheck(ctx context.Context, a *admission) (skip bool, before int64) {
	if m.cfg.CheckFirstCopies || a.d.UUID == "" || leases(a.t.store) {
		return false, 0
	}
	consumers := max(len(a.t.consumers), 1)
	if a.t.orderKey == "" {
		return a.t.firstCopies.take(a.d, consumers), 0
	}
	before, first := a.t.firstCopies.peek(a.d)
	if !first {
		return false, 0
	}
	if before != 0 && !a.t.holds.completed(heldKey{a.d.Consumer, before}) {
		if _, ok := a.t.completing.Load(completingKey{id: before, consumer: a.d.Consumer}); !ok && m.reg.resends() != nil && a.t.onItsWayHere(before, a.d.Consumer) {
			// Not taken: the copy sent again once before completed is
			// the first copy still.
			return false, before
		}
	}
	if !a.t.firstCopies.take(a.d, consumers) {
		return false, 0
	}
	if a.t.holds.waitedOn(heldKey{a.d.Consumer, a.d.ID}) {
		// A later record's first copy came first, and waits for this
		// one: the broker reorders this process's keyed messages.
		a.t.deferred.sawReorder()
	}
	if before == 0 || a.t.holds.completed(heldKey{a.d.Consumer, before}) {
		// The earlier records of its key are done.
		a.unchecked = true
		return true, 0
	}
	if c, ok := a.t.completing.Load(completingKey{id: before, consumer: a.d.Consumer}); ok {
		// The earlier record's handler ran here and its completion is on
		// its way (a broker that keeps order delivers this copy right
		// after it): the copy waits for it in the handler, and runs once
		// it committed, never before, so that a crash cannot make the
		// earlier record run again after this one.
		c := c.(*completion)
		select {
		case <-c.done:
		case <-ctx.Done():
			return false, 0
		}
		a.unchecked = c.ok
		return c.ok, 0
	}
	return false, 0
}

// leases reports whether the store has a delivery lease, which the check
// takes.
func leases(s recordstore.Store) bool {
	l, ok := s.(interface{ Lease() time.Duration })
	return !ok || l.Lease() > 0
}
