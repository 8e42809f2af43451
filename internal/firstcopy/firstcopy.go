// Package firstcopy remembers the records a process has just published,
// so that the first copy of each, per local consumer, may run without the
// check: the publish has just saved the record, pending, due and the
// message's own.
package firstcopy

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// kept is how many records of one topic the publisher
// remembers; an older one is checked as any copy is.
const kept = 1 << 14

// Set holds the records of one topic this process published lately
// whose first copy has not reached every local consumer.
type Set struct {
	// On is set once a middleware without Check.FirstCopies is built on the
	// registry: until then the publisher remembers nothing.
	On   atomic.Bool
	mu   sync.Mutex
	byID map[int64]*firstCopy
	ring []int64
	next int
	// arrived is the latest time (unix nanoseconds) at which the message
	// of a first copy that reached this process was sent; lastArrival is
	// when the latest first copy reached it.
	arrived, lastArrival atomic.Int64
}

type firstCopy struct {
	uuid string
	// taken are the consumers whose first copy ran.
	taken []string
	// before is, on a topic with an order key, the earlier record of its
	// key the record waited for when it was saved; 0 for none.
	before int64
	// sent is when (unix nanoseconds) its message was last sent.
	sent int64
}

// Saved remembers the records a publish saved. On an ordered topic before
// names, by id, the earlier record of its key each waits for, and a
// record it does not name is not remembered: its first copy is checked.
// before is nil on a topic without a key.
func (f *Set) Saved(recs []recordstore.Record, before map[int64]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byID == nil {
		f.byID = make(map[int64]*firstCopy, 1024)
		f.ring = make([]int64, kept)
	}
	now := time.Now().UnixNano()
	for _, r := range recs {
		b, ok := before[r.ID]
		if r.UUID == "" || before != nil && !ok {
			continue
		}
		delete(f.byID, f.ring[f.next])
		f.ring[f.next] = r.ID
		f.next = (f.next + 1) % kept
		f.byID[r.ID] = &firstCopy{uuid: r.UUID, before: b, sent: now}
	}
}

// Resent records that the message of record id, held or parked in this
// process, was sent again now.
func (f *Set) Resent(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.byID[id]; c != nil {
		c.sent = time.Now().UnixNano()
	}
}

// Behind reports whether the first copy of record id has yet to reach
// consumer while first copies keep coming (one came within margin), none
// of them sent more than margin after it: the copy is still in the
// broker's queue, behind the others, rather than taken by another
// instance or lost.
func (f *Set) Behind(id int64, consumer string, margin time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.byID[id]
	if c == nil || slices.Contains(c.taken, consumer) {
		return false
	}
	return f.arrived.Load() < c.sent+int64(margin) && time.Now().UnixNano()-f.lastArrival.Load() < int64(margin)
}

// arrive records that a first copy reached this process now. The caller
// holds mu.
func (f *Set) arrive(c *firstCopy) {
	f.lastArrival.Store(time.Now().UnixNano())
	if c.sent > f.arrived.Load() {
		f.arrived.Store(c.sent)
	}
}

// Take reports whether the delivery is the first copy, for its consumer,
// of a record this process published, and counts it taken; consumers is
// how many local consumers the topic has.
func (f *Set) Take(d recordstore.Delivery, consumers int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.first(d)
	if c == nil {
		return false
	}
	f.arrive(c)
	c.taken = append(c.taken, d.Consumer)
	if len(c.taken) >= consumers {
		delete(f.byID, d.ID)
	}
	return true
}

// Peek reports whether the delivery would be a first copy, and the
// earlier record of its key the record waited for when it was saved,
// without counting it taken.
func (f *Set) Peek(d recordstore.Delivery) (before int64, first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.first(d)
	if c == nil {
		return 0, false
	}
	f.arrive(c)
	return c.before, true
}

// Coming reports whether the first copy of record id, which this process
// published, has yet to reach consumer.
func (f *Set) Coming(id int64, consumer string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.byID[id]
	return c != nil && !slices.Contains(c.taken, consumer)
}

// first is the record of a delivery that is its consumer's first copy;
// nil for any other. The caller holds mu.
func (f *Set) first(d recordstore.Delivery) *firstCopy {
	c := f.byID[d.ID]
	if c == nil || c.uuid != d.UUID || slices.Contains(c.taken, d.Consumer) {
		return nil
	}
	return c
}
