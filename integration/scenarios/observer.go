package scenarios

import (
	"sync"
	"testing"
	"time"

	"github.com/wmoutbox/outbox/observe"
)

// counts is an [observe.Observer] that counts what the outbox reports per
// event and consumer, so that a scenario can tell a handler that ran
// tracked from one that ran untracked, and a skipped copy from a lost one.
type counts struct {
	mu sync.Mutex
	n  map[event]int
	// changed is signalled after every count.
	changed chan struct{}
}

type event struct{ what, consumer string }

var _ observe.Observer = (*counts)(nil)

func newCounts() *counts { return &counts{n: map[event]int{}, changed: make(chan struct{}, 1)} }

func (c *counts) add(what, consumer string, n int) {
	c.mu.Lock()
	c.n[event{what, consumer}] += n
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// waitFor waits until the event was reported n times for the consumer.
func (c *counts) waitFor(t *testing.T, what, consumer string, n int) {
	t.Helper()
	timeout := time.NewTimer(waitTimeout)
	defer timeout.Stop()
	for c.get(what, consumer) < n {
		select {
		case <-c.changed:
		case <-timeout.C:
			t.Fatalf("%s for %q: %d of %d within %v", what, consumer, c.get(what, consumer), n, waitTimeout)
		}
	}
}

// get returns how many times the event was reported for the consumer.
func (c *counts) get(what, consumer string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[event{what, consumer}]
}

func (c *counts) Published(string, int)                  {}
func (c *counts) Resent(string, observe.ResendKind, int) {}
func (c *counts) Completed(_, consumer string)           { c.add("handled", consumer, 1) }
func (c *counts) DuplicateSkipped(_, consumer string)    { c.add("duplicate", consumer, 1) }
func (c *counts) Failed(_, consumer string)              { c.add("failed", consumer, 1) }
func (c *counts) Abandoned(_, consumer string)           { c.add("abandoned", consumer, 1) }
func (c *counts) NotOwned(_, consumer string)            { c.add("not-owned", consumer, 1) }
func (c *counts) UnknownRecord(_, consumer string)       { c.add("unknown", consumer, 1) }
func (c *counts) Mismatched(_, consumer string)          { c.add("mismatched", consumer, 1) }
