// Package background counts the work the outbox runs off a handler's path
// (the completions that follow an acknowledgement, a completion on the
// router's acknowledgement, the resend of the next record of an order key,
// a receiver seen, the drain of a failed start) and the loops its router
// plugins run; it bounds the completions, gathers them into batches, and
// lets a service wait for all of it before it stops.
package background

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Closed is a channel that is closed.
var Closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// maxBackground is how many completions may run in the background at
// once; a handler that finishes beyond it completes on its own path.
const maxBackground = 4096

// maxBatch is how many completions one batch gathers at most: the one that
// fills it sends it at once, before its wait is over, so that a high rate
// neither waits for a window nor fills maxBackground.
const maxBatch = 1024

// Work counts the goroutines the outbox runs off a handler's
// path and the router plugins' loops, and gathers the completions in the
// background into batches.
type Work struct {
	mu      sync.Mutex
	running int
	idle    chan struct{} // closed when running drops to 0; nil while 0
	// completions is how many of running are completions gathered into
	// batches (bounded by maxBackground); batch is closed when the
	// gathering batch goes, nil while none gathers.
	completions int
	batch       chan struct{}
	// batchLen is how many completions joined batch.
	batchLen int
	// completionsIdle is closed when completions drops to 0; nil while 0.
	completionsIdle chan struct{}
	// loops are the router plugins' loops that run.
	loops []*pluginLoop
	// draining is set once a router of the registry closes, until one
	// starts: completions then go on the handlers' path
	// (the registry's closingPublisher).
	Draining atomic.Bool
}

// pluginLoop is a router plugin's loop (the stale resubmitter's, the
// cleaner's, a replay after the router runs), which runs as long as its
// router does.
type pluginLoop struct {
	// stopping reports whether its router closes or has closed.
	stopping func() bool
	ended    chan struct{}
}

// Spawn runs f in a goroutine that is counted until f returns.
func (b *Work) Spawn(f func()) {
	b.Add()
	go func() {
		defer b.Done()
		f()
	}()
}

func (b *Work) Add() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.addLocked()
}

func (b *Work) addLocked() {
	if b.running == 0 {
		b.idle = make(chan struct{})
	}
	b.running++
}

func (b *Work) Done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.doneLocked()
}

func (b *Work) doneLocked() {
	b.running--
	if b.running == 0 {
		close(b.idle)
		b.idle = nil
	}
}

// StartCompletion takes a place for one completion and returns the
// channel closed when its batch goes, wait after the batch's first
// completion or once maxBatch joined it; false when maxBackground run. Its
// goroutine calls DoneCompletion once it completed.
func (b *Work) StartCompletion(wait time.Duration) (<-chan struct{}, bool) {
	if b.Draining.Load() {
		return nil, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.completions >= maxBackground {
		return nil, false
	}
	if b.completions == 0 {
		b.completionsIdle = make(chan struct{})
	}
	b.completions++
	b.addLocked()
	if wait <= 0 {
		return Closed, true
	}
	if b.batch == nil {
		batch := make(chan struct{})
		b.batch, b.batchLen = batch, 0
		time.AfterFunc(wait, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.sendLocked(batch)
		})
	}
	batch := b.batch
	if b.batchLen++; b.batchLen == maxBatch {
		b.sendLocked(batch)
	}
	return batch, true
}

// sendLocked closes batch, unless it went already (full, before its wait
// was over).
func (b *Work) sendLocked(batch <-chan struct{}) {
	if b.batch != batch {
		return
	}
	close(b.batch)
	b.batch = nil
}

// WaitCompletions waits until no completion runs in the background, or ctx
// ends.
func (b *Work) WaitCompletions(ctx context.Context) error {
	b.mu.Lock()
	idle := b.completionsIdle
	b.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DoneCompletion gives back the place of a completion that finished.
func (b *Work) DoneCompletion() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.completions--
	if b.completions == 0 {
		close(b.completionsIdle)
		b.completionsIdle = nil
	}
	b.doneLocked()
}

// StartLoop counts a router plugin's loop until end is called, once it
// returned; stopping reports whether its router closes or has closed.
func (b *Work) StartLoop(stopping func() bool) (end func()) {
	l := &pluginLoop{stopping: stopping, ended: make(chan struct{})}
	b.mu.Lock()
	b.loops = append(b.loops, l)
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		b.loops = slices.DeleteFunc(b.loops, func(o *pluginLoop) bool { return o == l })
		b.mu.Unlock()
		close(l.ended)
	}
}

// Busy returns a channel to wait on while work runs: closed when the
// goroutines counted are done, or when a loop of a closing router ended;
// nil when nothing runs but the loops of routers that still run.
func (b *Work) Busy() <-chan struct{} {
	b.mu.Lock()
	idle, loops := b.idle, slices.Clone(b.loops)
	b.mu.Unlock()
	if idle != nil {
		return idle
	}
	// Outside the lock: a router's IsClosed waits while its Close does,
	// and Close waits for handlers that may be starting work.
	for _, l := range loops {
		if l.stopping() {
			return l.ended
		}
	}
	return nil
}
