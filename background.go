package outbox

// Completions in the background (MiddlewareConfig.CompleteInBackground):
// the registry counts them, bounds them, and lets a service wait for them
// before it stops.

import (
	"context"
	"sync"
	"time"
)

// maxBackground is how many completions may run in the background at
// once; a handler that finishes beyond it completes on its own path.
const maxBackground = 4096

// backgroundCompletions counts the completions running in the background
// and gathers them into batches.
type backgroundCompletions struct {
	mu      sync.Mutex
	running int
	idle    chan struct{} // closed when running drops to 0; nil while 0
	// batch is closed when the gathering batch goes; nil while none
	// gathers.
	batch chan struct{}
}

// start takes a place for one completion and returns the channel closed
// when its batch goes, wait after the batch's first completion; false when
// maxBackground run.
func (b *backgroundCompletions) start(wait time.Duration) (<-chan struct{}, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running >= maxBackground {
		return nil, false
	}
	if b.running == 0 {
		b.idle = make(chan struct{})
	}
	b.running++
	if wait <= 0 {
		return closed, true
	}
	if b.batch == nil {
		batch := make(chan struct{})
		b.batch = batch
		time.AfterFunc(wait, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			close(batch)
			b.batch = nil
		})
	}
	return b.batch, true
}

// add counts one more piece of work in the background beyond the bound
// of start: an insert whose publish has returned (publisher_decorator.go).
func (b *backgroundCompletions) add() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running == 0 {
		b.idle = make(chan struct{})
	}
	b.running++
}

// done gives back the place of a completion that finished.
func (b *backgroundCompletions) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running--
	if b.running == 0 {
		close(b.idle)
		b.idle = nil
	}
}

// WaitCompletions waits until no completion runs in the background
// ([MiddlewareConfig.CompleteInBackground]) and no insert of a publish that
// returned before its answer ([NewPublisher]), or ctx ends, whose error it
// returns. Call it after the router has closed and before the service
// exits, so that the records of the last handled messages are complete
// rather than sent again at the next start. With nothing in the background
// it returns at once.
func (r *Registry) WaitCompletions(ctx context.Context) error {
	for {
		r.background.mu.Lock()
		idle := r.background.idle
		r.background.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
