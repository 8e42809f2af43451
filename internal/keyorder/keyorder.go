// Package keyorder keeps, for the topics with an order key, the deliveries
// that wait in this process for an earlier record of their key to complete
// here, the deliveries whose handlers run here, and the ones that completed
// lately. Only ordered topics reach it.
package keyorder

import (
	"sync"
)

// closed is a channel that is closed.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Key names one consumer's delivery of one record of a topic.
type Key struct {
	Consumer string
	ID       int64
}

// Waiters are the copies of one topic that wait, in their handlers,
// for a record of their key to complete here.
type Waiters struct {
	mu sync.Mutex
	m  map[Key]*entry
	// recent are the deliveries that completed here lately (the last
	// recentDone), so that a copy held by one of them that starts waiting
	// after its completion does not wait for it.
	recent map[Key]struct{}
	ring   []Key
	next   int
	// running holds the deliveries whose handler runs in this process, so
	// that two copies of one record never run at once here (another
	// process is kept out by the store's lease).
	running sync.Map // Key -> struct{}
	// Asked throttles, per record, this process's asks to send it again.
	Asked sync.Map // int64 -> *atomic.Int64 (unix nanoseconds)
	// PutBack are the keys of which this process put a record back: the
	// next completion of a record of such a key claims at once, without
	// waiting for a batch of claims.
	PutBack sync.Map // string -> struct{}
}

// recentDone is how many completed deliveries heldWaiters remembers.
const recentDone = 4096

type entry struct {
	wake    chan struct{}
	waiting int
}

// Wait returns a channel closed when the delivery k completes here, and a
// function to call once done waiting.
func (h *Waiters) Wait(k Key) (<-chan struct{}, func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, done := h.recent[k]; done {
		return closed, func() {}
	}
	e := h.entryOf(k)
	e.waiting++
	return e.wake, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if cur := h.m[k]; cur == e {
			e.waiting--
			if e.waiting == 0 {
				delete(h.m, k)
			}
		}
	}
}

func (h *Waiters) entryOf(k Key) *entry {
	if h.m == nil {
		h.m = map[Key]*entry{}
	}
	e := h.m[k]
	if e == nil {
		e = &entry{wake: make(chan struct{})}
		h.m[k] = e
	}
	return e
}

// Done wakes the copies waiting for k, and reports whether there were
// any.
func (h *Waiters) Done(k Key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.recent == nil {
		h.recent = make(map[Key]struct{}, recentDone)
		h.ring = make([]Key, recentDone)
	}
	delete(h.recent, h.ring[h.next])
	h.ring[h.next] = k
	h.next = (h.next + 1) % recentDone
	h.recent[k] = struct{}{}
	e := h.m[k]
	if e == nil {
		return false
	}
	delete(h.m, k)
	close(e.wake)
	return e.waiting > 0
}

// WaitedOn reports whether a copy waits for the delivery k.
func (h *Waiters) WaitedOn(k Key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.m[k]
	return e != nil && e.waiting > 0
}

// Completed reports whether the delivery k completed here lately.
func (h *Waiters) Completed(k Key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.recent[k]
	return ok
}

// ClaimRun takes the delivery's place among the handlers running here;
// false when a copy of the record runs already.
func (h *Waiters) ClaimRun(k Key) bool {
	_, taken := h.running.LoadOrStore(k, struct{}{})
	return !taken
}

func (h *Waiters) EndRun(k Key) { h.running.Delete(k) }

// Runs reports whether the delivery k's handler runs here.
func (h *Waiters) Runs(k Key) bool {
	_, ok := h.running.Load(k)
	return ok
}
