package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// coalescer combines concurrent calls of one kind into batches, without a
// timer. A call that arrives while fewer than maxInFlight batches run is run
// at once, alone, on the caller's goroutine and context: without contention
// it costs two uncontended mutex operations. A call that arrives while
// maxInFlight batches run waits; when a batch finishes, the calls that
// waited meanwhile (up to maxItems items) leave together as the next batch,
// run by the first of them. So batches grow with the load and a quiet
// store adds no latency. With fewCallers set, a few concurrent calls also
// run alone rather than wait.
type coalescer[T any] struct {
	maxInFlight int
	maxItems    int
	// fewCallers, when above 0, also runs a call alone, beyond
	// maxInFlight, while no call waits, fewer than fewCallers calls are
	// running, and no call of this window of calls or the last one found
	// more than fewCallers calls running, waiting or arriving: with a few
	// callers, waiting for a statement in flight costs more than combining
	// saves; with more, calls combine as without it.
	fewCallers int
	// one runs a call alone.
	one func(ctx context.Context, arg T) error
	// many runs a batch of two calls or more and sets every call's err (and
	// results). ctx is done only when every call's context is done.
	many func(ctx context.Context, batch []*call[T])
	// alone, when set, runs a call that one or many answered with
	// errAlone: on the caller's goroutine, after its statement's slot was
	// handed on, so that a call that may wait (for a row another
	// transaction holds) waits alone and holds up no other call.
	alone func(ctx context.Context, arg T) error

	mu       sync.Mutex
	inFlight int
	// running is how many calls the statements in flight carry.
	running int
	// windowCalls counts the calls of the current window; windowPeak is
	// the most calls one of them found running, waiting or arriving (itself
	// included), and lastPeak that of the previous window.
	windowCalls, windowPeak, lastPeak int
	queue                             []*call[T]
	// observe, when set (by tests only), sees every change of state while
	// the mutex is held; it must not block.
	observe func(inFlight, queued int)
}

// call is one caller's request, and its outcome once run.
type call[T any] struct {
	ctx   context.Context
	arg   T
	items int
	err   error
	// wake is signalled exactly once: to run lead, or when err is set.
	wake chan struct{}
	lead []*call[T]
}

func newCoalescer[T any](maxInFlight, maxItems int, one func(context.Context, T) error, many func(context.Context, []*call[T])) *coalescer[T] {
	return &coalescer[T]{maxInFlight: maxInFlight, maxItems: maxItems, one: one, many: many}
}

// do runs arg, alone or with other calls, and returns its own outcome. A
// call that leaves the queue because its context is done returns the
// context's error; once its batch is on its way, it waits for and returns
// the batch's real outcome, so that the error says whether the work was done.
func (c *coalescer[T]) do(ctx context.Context, arg T, items int) error {
	c.mu.Lock()
	if c.fewCallers > 0 {
		c.count()
	}
	if c.inFlight < c.maxInFlight || (len(c.queue) == 0 && c.running < c.fewCallers && max(c.windowPeak, c.lastPeak) <= c.fewCallers) {
		c.inFlight++
		c.running++
		c.changed()
		c.mu.Unlock()
		err := func() error {
			defer c.handOff(1)
			return c.one(ctx, arg)
		}()
		return c.finish(ctx, arg, err)
	}
	cl := &call[T]{ctx: ctx, arg: arg, items: items, wake: make(chan struct{}, 1)}
	c.queue = append(c.queue, cl)
	c.changed()
	c.mu.Unlock()

	select {
	case <-cl.wake:
	case <-ctx.Done():
		if c.withdraw(cl) {
			return ctx.Err()
		}
		<-cl.wake
	}
	if batch := cl.lead; batch != nil {
		func() {
			defer c.handOff(len(batch))
			c.runBatch(batch)
		}()
	}
	return c.finish(ctx, arg, cl.err)
}

// doAll runs args, which arrived together, as batches of up to maxItems,
// alone or with other calls, and returns each one's outcome in the order of
// args. Its calls queue behind the statements in flight as do's would, in
// order, and this goroutine runs each batch that one of them leads; a batch
// that a statement slot lets go at once runs without waiting.
func (c *coalescer[T]) doAll(ctx context.Context, args []T) []error {
	calls := make([]*call[T], len(args))
	for i, arg := range args {
		calls[i] = &call[T]{ctx: ctx, arg: arg, items: 1, wake: make(chan struct{}, 1)}
	}
	for start := 0; start < len(calls); start += c.maxItems {
		c.runAll(ctx, calls[start:min(start+c.maxItems, len(calls))])
	}
	errs := make([]error, len(calls))
	for i, cl := range calls {
		errs[i] = cl.err
	}
	return errs
}

// runAll runs calls, at most maxItems, for doAll: as one batch when a slot
// is free and no call waits, in the queue otherwise.
func (c *coalescer[T]) runAll(ctx context.Context, calls []*call[T]) {
	c.mu.Lock()
	if c.inFlight < c.maxInFlight && len(c.queue) == 0 {
		c.inFlight++
		c.running += len(calls)
		c.changed()
		c.mu.Unlock()
		func() {
			defer c.handOff(len(calls))
			c.runBatch(calls)
		}()
		return
	}
	c.queue = append(c.queue, calls...)
	c.changed()
	c.mu.Unlock()
	for _, cl := range calls {
		select {
		case <-cl.wake:
		case <-ctx.Done():
			if c.withdraw(cl) {
				cl.err = ctx.Err()
				continue
			}
			<-cl.wake
		}
		if batch := cl.lead; batch != nil {
			func() {
				defer c.handOff(len(batch))
				c.runBatch(batch)
			}()
		}
	}
}

// errAlone is set by one or many for a call that alone must finish.
var errAlone = errors.New("sqlstore: the call finishes alone")

// finish runs alone for a call answered with errAlone.
func (c *coalescer[T]) finish(ctx context.Context, arg T, err error) error {
	if err == errAlone { //nolint:errorlint // set as it is, never wrapped
		return c.alone(ctx, arg)
	}
	return err
}

// window is how many calls make one window of fewCallers' count.
const window = 64

// count records how many calls the arriving one finds, for fewCallers.
func (c *coalescer[T]) count() {
	c.windowPeak = max(c.windowPeak, c.running+len(c.queue)+1)
	if c.windowCalls++; c.windowCalls == window {
		c.lastPeak, c.windowPeak, c.windowCalls = c.windowPeak, 0, 0
	}
}

// runBatch runs a batch on the goroutine of its first call and wakes the
// others once their outcomes are set. A panic in the driver reaches the
// first call's goroutine; the other calls fail with ErrStatementPanicked
// rather than wait forever, and the slot is handed on by the caller's defer.
func (c *coalescer[T]) runBatch(batch []*call[T]) {
	if len(batch) == 1 {
		batch[0].err = c.one(batch[0].ctx, batch[0].arg)
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	defer func() {
		p := recover()
		for _, other := range batch[1:] {
			if p != nil {
				other.err = fmt.Errorf("%w: %v", ErrStatementPanicked, p)
			}
			other.wake <- struct{}{}
		}
		if p != nil {
			panic(p)
		}
	}()
	c.many(ctx, batch)
}

// handOff is called when a statement carrying calls calls finished: the
// calls waiting now become the next batch, which keeps the finished
// statement's slot.
func (c *coalescer[T]) handOff(calls int) {
	c.mu.Lock()
	c.running -= calls
	// A slot beyond maxInFlight (a call of few that ran alone) is given
	// up: the waiting calls leave with the last slot within it.
	if len(c.queue) == 0 || c.inFlight > c.maxInFlight {
		c.inFlight--
		c.changed()
		c.mu.Unlock()
		return
	}
	n, items := 1, c.queue[0].items
	for n < len(c.queue) && items+c.queue[n].items <= c.maxItems {
		items += c.queue[n].items
		n++
	}
	batch := slices.Clone(c.queue[:n])
	c.queue = slices.Delete(c.queue, 0, n)
	c.running += n
	c.changed()
	c.mu.Unlock()
	batch[0].lead = batch
	batch[0].wake <- struct{}{}
}

// withdraw takes a waiting call out of the queue; false when a batch has
// already taken it.
func (c *coalescer[T]) withdraw(cl *call[T]) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, q := range c.queue {
		if q == cl {
			c.queue = slices.Delete(c.queue, i, i+1)
			c.changed()
			return true
		}
	}
	return false
}

func (c *coalescer[T]) changed() {
	if c.observe != nil {
		c.observe(c.inFlight, len(c.queue))
	}
}

// batchContext is done only when every call's context is done, so that one
// caller giving up does not fail the others; it keeps the first call's
// values.
func batchContext[T any](batch []*call[T]) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(batch[0].ctx))
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, cl := range batch {
		stops[i] = context.AfterFunc(cl.ctx, func() {
			if left.Add(-1) == 0 {
				cancel(context.Cause(cl.ctx))
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel(nil)
	}
}
