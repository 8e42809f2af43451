package sqlstore

import (
	"context"
	"fmt"
	"sync"
)

// QueueWatch follows the state of one of a store's coalescers.
type QueueWatch struct {
	mu       sync.Mutex
	inFlight int
	queued   int
	changed  chan struct{}
	history  [][2]int
}

func watch[T any](c *coalescer[T]) *QueueWatch {
	w := &QueueWatch{changed: make(chan struct{})}
	c.observe = func(inFlight, queued int) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.inFlight, w.queued = inFlight, queued
		w.history = append(w.history, [2]int{inFlight, queued})
		close(w.changed)
		w.changed = make(chan struct{})
	}
	return w
}

// WatchInserts follows the store's insert coalescer; call it before the store
// is used.
func WatchInserts(s *Store) *QueueWatch { return watch(s.inserts) }

// WatchCompletes follows the store's completion coalescer; call it before the
// store is used.
func WatchCompletes(s *Store) *QueueWatch { return watch(s.completes) }

// History is every state the coalescer went through, as (in flight,
// queued).
func (w *QueueWatch) History() [][2]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([][2]int(nil), w.history...)
}

// Wait returns once inFlight statements run and queued calls wait.
func (w *QueueWatch) Wait(ctx context.Context, inFlight, queued int) error {
	for {
		w.mu.Lock()
		gotF, gotQ, changed := w.inFlight, w.queued, w.changed
		w.mu.Unlock()
		if gotF == inFlight && gotQ == queued {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d in flight and %d queued, have %d and %d: %w", inFlight, queued, gotF, gotQ, ctx.Err())
		}
	}
}

// WatchChecks follows the store's check coalescer; call it before the store
// is used. It is nil where checks are not combined.
func WatchChecks(s *Store) *QueueWatch {
	if s.checks == nil {
		return nil
	}
	return watch(s.checks)
}

// TopicListStatements returns the statements of List by topic: one
// topic's pending and abandoned pages, and a consumer's pending page.
func TopicListStatements(s *Store) (pending, abandoned, consumer string) {
	l := &s.q.list
	return l.byTopic[Pending], l.byTopic[Abandoned], l.byConsumer
}

// Prepared is how many statements s keeps prepared on its pool.
func Prepared(s *Store) int {
	a := s.att.Load()
	if a == nil || a.stmts == nil {
		return 0
	}
	a.stmts.mu.RLock()
	defer a.stmts.mu.RUnlock()
	return len(a.stmts.m)
}

// ConvertError is how the dialect converts a driver error.
func ConvertError(d *Dialect, err error) error { return d.convertError(err) }
