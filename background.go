package outbox

// Work in the background: what the outbox runs off a handler's path (the
// completions that follow an acknowledgement, unless
// MiddlewareConfig.CompleteBeforeAck; a completion on the router's
// acknowledgement, the resend of the next record of an order key,
// a receiver seen, the drain of a failed start) and the loops its router
// plugins run. The registry counts all of it, bounds the completions, and
// lets a service wait for it before it stops.

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// maxBackground is how many completions may run in the background at
// once; a handler that finishes beyond it completes on its own path.
const maxBackground = 4096

// backgroundWork counts the goroutines the outbox runs off a handler's
// path and the router plugins' loops, and gathers the completions in the
// background into batches.
type backgroundWork struct {
	mu      sync.Mutex
	running int
	idle    chan struct{} // closed when running drops to 0; nil while 0
	// completions is how many of running are completions gathered into
	// batches (bounded by maxBackground); batch is closed when the
	// gathering batch goes, nil while none gathers.
	completions int
	batch       chan struct{}
	// completionsIdle is closed when completions drops to 0; nil while 0.
	completionsIdle chan struct{}
	// loops are the router plugins' loops that run.
	loops []*pluginLoop
	// draining is set once a router of the registry closes, until one
	// starts: completions then go on the handlers' path
	// ([closingPublisher]).
	draining atomic.Bool
}

// pluginLoop is a router plugin's loop (the stale resubmitter's, the
// cleaner's, a replay after the router runs), which runs as long as its
// router does.
type pluginLoop struct {
	// stopping reports whether its router closes or has closed.
	stopping func() bool
	ended    chan struct{}
}

// spawn runs f in a goroutine that is counted until f returns.
func (b *backgroundWork) spawn(f func()) {
	b.add()
	go func() {
		defer b.done()
		f()
	}()
}

func (b *backgroundWork) add() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.addLocked()
}

func (b *backgroundWork) addLocked() {
	if b.running == 0 {
		b.idle = make(chan struct{})
	}
	b.running++
}

func (b *backgroundWork) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.doneLocked()
}

func (b *backgroundWork) doneLocked() {
	b.running--
	if b.running == 0 {
		close(b.idle)
		b.idle = nil
	}
}

// startCompletion takes a place for one completion and returns the
// channel closed when its batch goes, wait after the batch's first
// completion; false when maxBackground run. Its goroutine calls
// doneCompletion once it completed.
func (b *backgroundWork) startCompletion(wait time.Duration) (<-chan struct{}, bool) {
	if b.draining.Load() {
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

// drainTimeout bounds how long a closing router's handler publisher waits
// for the completions in the background ([closingPublisher]).
const drainTimeout = 10 * time.Second

// closingPublisher is the publisher of a router's handler, decorated by
// [ReplayPlugin]: the router closes it when the handler stops, before its
// Close returns, and then the completions of the handler's messages that
// went in the background are committed first, and those of the messages
// still being handled go on the handlers' path (which the router waits
// for), so that a clean stop leaves no record pending for its completion.
type closingPublisher struct {
	message.Publisher
	reg  *Registry
	once sync.Once
}

func (p *closingPublisher) Close() error {
	p.once.Do(func() {
		p.reg.background.draining.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
		defer cancel()
		_ = p.reg.background.waitCompletions(ctx)
	})
	return p.Publisher.Close()
}

// Unwrap returns the decorated publisher.
func (p *closingPublisher) Unwrap() message.Publisher { return p.Publisher }

// waitCompletions waits until no completion runs in the background, or ctx
// ends.
func (b *backgroundWork) waitCompletions(ctx context.Context) error {
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

// doneCompletion gives back the place of a completion that finished.
func (b *backgroundWork) doneCompletion() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.completions--
	if b.completions == 0 {
		close(b.completionsIdle)
		b.completionsIdle = nil
	}
	b.doneLocked()
}

// startLoop counts a router plugin's loop until end is called, once it
// returned; stopping reports whether its router closes or has closed.
func (b *backgroundWork) startLoop(stopping func() bool) (end func()) {
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

// busy returns a channel to wait on while work runs: closed when the
// goroutines counted are done, or when a loop of a closing router ended;
// nil when nothing runs but the loops of routers that still run.
func (b *backgroundWork) busy() <-chan struct{} {
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

// WaitCompletions waits until nothing of the outbox runs in the
// background, or ctx ends, whose error it returns. In the background run
// the completions of successful handlers (unless
// [MiddlewareConfig.CompleteBeforeAck]) and those that follow the router's
// acknowledgement of a handler that produced messages (with the inbox
// entries and confirmations of another service's messages), the resends of
// the next record of an order key, the records of receivers seen, the
// inserts of publishes that returned before their answer ([NewPublisher]),
// and the loops of the outbox's router plugins once their router closes.
// Router.Close waits for the handlers, and with [ReplayPlugin] for the
// completions (up to 10 s): call WaitCompletions after it returned nil,
// before the service exits, and the outbox calls no store or publisher for
// that router again. With nothing in the background it returns at once.
func (r *Registry) WaitCompletions(ctx context.Context) error {
	for {
		busy := r.background.busy()
		if busy == nil {
			return nil
		}
		select {
		case <-busy:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
