package outbox

// The completions of one batch window (Complete.BatchWait) of a topic,
// handed to a store that implements recordstore.BatchCompleter together.

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/wmoutbox/outbox/recordstore"
)

// completionWindows gathers a topic's completions per batch window.
type completionWindows struct {
	mu      sync.Mutex
	windows map[<-chan struct{}][]*windowed
}

// windowed is one delivery's completion in a window: done is closed once
// it ended, and ok then says whether the record is complete.
type windowed struct {
	ctx  context.Context
	a    *admission
	ok   bool
	done chan struct{}
}

// join adds the completion of a's delivery to the window that ends when
// batch is closed.
func (w *completionWindows) join(ctx context.Context, batch <-chan struct{}, a *admission) *windowed {
	c := &windowed{ctx: ctx, a: a, done: make(chan struct{})}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.windows == nil {
		w.windows = map[<-chan struct{}][]*windowed{}
	}
	w.windows[batch] = append(w.windows[batch], c)
	return c
}

// take returns the completions gathered for the window of batch and
// forgets them; nil when another goroutine took them. One joined after
// that makes a window of its own, which its goroutine takes.
func (w *completionWindows) take(batch <-chan struct{}) []*windowed {
	w.mu.Lock()
	defer w.mu.Unlock()
	cs := w.windows[batch]
	delete(w.windows, batch)
	return cs
}

// completeWindow completes c with the other completions of its window once
// the window ended: the first of them to run completes them all, with one
// CompleteBatch call. It reports whether c's record is now complete.
func (m *middleware) completeWindow(t *tracked, batch <-chan struct{}, c *windowed) bool {
	if cs := t.window.take(batch); cs != nil {
		m.completeAll(t, cs)
	}
	<-c.done
	return c.ok
}

// completeAll completes cs, the completions of one window of topic t,
// whose store is a [recordstore.BatchCompleter].
func (m *middleware) completeAll(t *tracked, cs []*windowed) {
	defer func() {
		for _, c := range cs {
			close(c.done)
		}
	}()
	if len(cs) == 1 {
		cs[0].ok = m.complete(cs[0].ctx, cs[0].a)
		return
	}
	ctxs := make([]context.Context, len(cs))
	ends := make([]func(error), len(cs))
	ds := make([]recordstore.Delivery, len(cs))
	tr := m.reg.tracer()
	for i, c := range cs {
		ctxs[i] = c.ctx
		if tr != nil {
			ctxs[i], ends[i] = tr.TraceComplete(c.ctx, RecordRef{Topic: t.topic, ID: c.a.d.ID, Consumer: c.a.d.Consumer})
		}
		ds[i] = c.a.d
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctxs[0]), m.cfg.Complete.Timeout)
	defer cancel()
	errs := t.store.(recordstore.BatchCompleter).CompleteBatch(ctx, ds)
	if len(errs) != len(ds) {
		err := fmt.Errorf("outbox: the store's CompleteBatch returned %d outcomes for %d deliveries", len(errs), len(ds))
		errs = slices.Repeat([]error{err}, len(ds))
	}
	for i, c := range cs {
		c.ok = m.completed(context.WithoutCancel(ctxs[i]), c.a, errs[i], ends[i])
	}
}
