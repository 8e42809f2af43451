package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// pipeline is what one end-to-end case sends through: publishers call pub,
// the router's handlers subscribe to sub, with middleware around them.
type pipeline struct {
	pub        message.Publisher
	sub        message.Subscriber
	middleware []message.HandlerMiddleware
	close      func()
	// stop, when set, stops what runs in the background (the forwarder)
	// before close, so that the cost meter reads counters no one moves.
	stop func()
	// caughtUp, when set, says whether the relay has passed every message
	// saved so far; once it has and nothing more arrives, the messages still
	// missing are lost, and the case need not wait for stall.
	caughtUp func() bool
}

// settle is how long nothing must arrive after caughtUp before the missing
// messages count as lost: the relay's hand-off to GoChannel.
const settle = 500 * time.Millisecond

// load says how the publishers publish: for a duration, each at most window
// messages ahead of its handler; paced, count messages at interval; or
// saturated, count messages as fast as Publish returns, with a window as
// large as count, so none is ever waited for.
type load struct {
	publishers int
	duration   time.Duration
	window     int
	count      int
	interval   time.Duration
	// stall ends the case once no message was handled for that long; the
	// messages still missing are reported as lost.
	stall time.Duration
	// until, when set, makes count a minimum: a paced publisher goes on
	// until until is closed.
	until <-chan struct{}
	// started, when set, is called once the router runs, as the publishers
	// start.
	started func()
	// meter, when set, measures what each delivered message cost the
	// database, from the start of the publishers until every message was
	// handled.
	meter *meter
}

// going reports whether a publisher with count messages sent goes on past
// count.
func (l load) going() bool {
	if l.until == nil {
		return false
	}
	select {
	case <-l.until:
		return false
	default:
		return true
	}
}

func openLoad(publishers int, o options) load {
	return load{publishers: publishers, duration: o.duration, window: o.window, stall: o.stall}
}

func pacedLoad(o options) load {
	return load{publishers: 1, window: o.window, count: o.pacedN, interval: time.Second / time.Duration(o.pacedRate), stall: o.stall}
}

func saturatedLoad(publishers int, o options) load {
	return load{publishers: publishers, window: o.saturatedN, count: o.saturatedN, stall: o.stall}
}

// defaultStall is well above the longest poll interval of the forwarder
// (1 s), so that a slow case is not cut short.
const defaultStall = 10 * time.Second

// errStalled is the cause of a case cut short by load.stall.
var errStalled = errors.New("no message handled for a while")

const publisherKey = "bench_publisher"

// topics are the topics of n publishers: one each, with one handler each,
// so that n publishers are also n concurrent handlers.
func topics(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "bench_" + strconv.Itoa(i)
	}
	return out
}

// endToEnd runs publishers, each on its own topic, into a router with one
// handler per topic, and measures messages handled per second and the time
// from the start of Publish to the handler. A message counts once the whole
// chain (with the outbox, its completion) is done.
func endToEnd(ctx context.Context, p pipeline, l load) (result, error) {
	defer p.close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return result{}, err
	}
	slots := make([]chan struct{}, l.publishers)
	for i := range slots {
		slots[i] = make(chan struct{}, l.window)
	}
	var handled, published, lastHandled atomic.Int64
	// Outermost: the message is done once everything inside returned.
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				if i, perr := strconv.Atoi(msg.Metadata.Get(publisherKey)); perr == nil && i < len(slots) {
					// Counted before the slot is freed: freeing the last one
					// ends the case.
					handled.Add(1)
					lastHandled.Store(time.Now().UnixNano())
					select {
					case <-slots[i]:
					default: // a redelivered copy
						handled.Add(-1)
					}
				}
			}
			return out, err
		}
	})
	router.AddMiddleware(p.middleware...)
	lat := &latencies{}
	names := topics(l.publishers)
	for _, topic := range names {
		router.AddNoPublisherHandler(topic, topic, p.sub, func(msg *message.Message) error {
			sent, err := strconv.ParseInt(msg.Metadata.Get(sentKey), 10, 64)
			if err != nil {
				return fmt.Errorf("message without %s: %w", sentKey, err)
			}
			lat.add(time.Since(time.Unix(0, sent)))
			return nil
		})
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(runCtx) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return result{}, fmt.Errorf("router: %w", err)
	}

	var failed atomic.Int64
	var firstErr error
	var once sync.Once
	drainCtx, stalled := context.WithCancelCause(ctx)
	defer stalled(nil)
	var wg sync.WaitGroup
	if l.started != nil {
		l.started()
	}
	if l.meter != nil {
		l.meter.start(ctx)
	}
	start := time.Now()
	lastHandled.Store(start.UnixNano())
	deadline := start.Add(l.duration)
	for i, topic := range names {
		wg.Go(func() {
			var tick <-chan time.Time
			if l.interval > 0 {
				t := time.NewTicker(l.interval)
				defer t.Stop()
				tick = t.C
			}
			for n := 0; ; n++ {
				if l.count > 0 {
					if n >= l.count && !l.going() {
						break
					}
					if tick != nil {
						<-tick
					}
				} else if !time.Now().Before(deadline) {
					break
				}
				select {
				case slots[i] <- struct{}{}:
				case <-drainCtx.Done():
					return
				}
				msg := benchMessage()
				msg.Metadata.Set(publisherKey, strconv.Itoa(i))
				if err := p.pub.Publish(topic, msg); err != nil {
					failed.Add(1)
					once.Do(func() { firstErr = err })
					<-slots[i]
					continue
				}
				published.Add(1)
			}
			// Filling the window again means every message was handled.
			for range l.window {
				select {
				case slots[i] <- struct{}{}:
				case <-drainCtx.Done():
					return
				}
			}
		})
	}
	stall := l.stall
	if stall == 0 {
		stall = defaultStall
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-watch.C:
			idle := time.Since(time.Unix(0, lastHandled.Load()))
			if idle > stall || (idle > settle && p.caughtUp != nil && published.Load() > handled.Load() && p.caughtUp()) {
				stalled(errStalled)
				<-done
				break wait
			}
		}
	}
	elapsed := time.Since(start)
	lost := published.Load() - handled.Load()
	if lost > 0 {
		// The time the stall detector waited is not the case's.
		elapsed = time.Unix(0, lastHandled.Load()).Sub(start)
	}
	if err := router.Close(); err != nil {
		return result{}, err
	}
	if err := <-runErr; err != nil {
		return result{}, fmt.Errorf("router: %w", err)
	}
	if handled.Load() == 0 {
		return result{}, errors.Join(errors.New("no message was handled"), firstErr)
	}
	r := result{rate: float64(handled.Load()) / elapsed.Seconds(), errors: failed.Load(), firstErr: firstErr, lost: lost,
		lastHandled: time.Unix(0, lastHandled.Load())}
	lat.into(&r)
	if l.meter != nil {
		if p.stop != nil {
			p.stop()
		}
		if r.cost, err = l.meter.stop(ctx, handled.Load()); err != nil {
			return result{}, err
		}
	}
	if r.rate == 0 {
		return r, errors.Join(errors.New("no message was handled"), firstErr)
	}
	return r, nil
}

func newGoChannel() *gochannel.GoChannel {
	return gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
}

// barePipeline is a Watermill router on GoChannel and nothing else.
func barePipeline() pipeline {
	gc := newGoChannel()
	return pipeline{pub: gc, sub: gc, close: func() { _ = gc.Close() }}
}

// untrackedPipeline has the outbox's decorator and middleware, with a
// registry that tracks other names than the ones published.
func untrackedPipeline() (pipeline, error) {
	reg, err := untrackedRegistry()
	if err != nil {
		return pipeline{}, err
	}
	return outboxPipeline(reg, func() {})
}

// outboxPipeline is GoChannel with the outbox's decorator and middleware.
func outboxPipeline(reg *outbox.Registry, cleanup func()) (pipeline, error) {
	return outboxPipelineWith(reg, cleanup, outbox.MiddlewareConfig{})
}

// outboxPipelineWith is outboxPipeline with the middleware's configuration
// given. The completions in the background, if any, are waited for before
// the cost meter reads its counters.
func outboxPipelineWith(reg *outbox.Registry, cleanup func(), cfg outbox.MiddlewareConfig) (pipeline, error) {
	gc := newGoChannel()
	pub, err := outbox.NewPublisher(reg, gc)
	if err != nil {
		return pipeline{}, err
	}
	mw, err := outbox.NewMiddleware(reg, cfg, nil)
	if err != nil {
		return pipeline{}, err
	}
	return pipeline{pub: pub, sub: gc, middleware: []message.HandlerMiddleware{mw},
		stop: func() { _ = reg.WaitCompletions(context.Background()) },
		close: func() {
			_ = reg.WaitCompletions(context.Background())
			_ = gc.Close()
			cleanup()
		}}, nil
}

// untrackedRegistry tracks two names no case publishes to, on a store that
// has no database: reaching it would fail.
func untrackedRegistry() (*outbox.Registry, error) {
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite()})
	if err != nil {
		return nil, err
	}
	return outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store}, outbox.Tracked{Topic: "payments", Store: store})
}

// trackedPipeline tracks every topic of the case in a new store, dropped
// when the pipeline closes.
func trackedPipeline(ctx context.Context, d *database, publishers int, co sqlstore.Coalescing) (pipeline, error) {
	return trackedPipelineOf(ctx, d, publishers, co, sqlstore.Delete)
}

// trackedPipelineOf is trackedPipeline with the completion mode given.
func trackedPipelineOf(ctx context.Context, d *database, publishers int, co sqlstore.Coalescing, mode sqlstore.Completion) (pipeline, error) {
	return trackedPipelineWith(ctx, d, publishers, co, mode, outbox.MiddlewareConfig{})
}

// trackedPipelineWith is trackedPipelineOf with the middleware's
// configuration given.
func trackedPipelineWith(ctx context.Context, d *database, publishers int, co sqlstore.Coalescing, mode sqlstore.Completion, cfg outbox.MiddlewareConfig) (pipeline, error) {
	store, err := d.newStoreOf(ctx, co, mode)
	if err != nil {
		return pipeline{}, err
	}
	return storePipelineWith(store, publishers, func() { d.drop(context.Background(), store) }, cfg)
}

// storePipeline tracks every topic of the case in store; cleanup runs when
// the pipeline closes.
func storePipeline(store *sqlstore.Store, publishers int, cleanup func()) (pipeline, error) {
	return storePipelineWith(store, publishers, cleanup, outbox.MiddlewareConfig{})
}

// storePipelineWith is storePipeline with the middleware's configuration
// given.
func storePipelineWith(store *sqlstore.Store, publishers int, cleanup func(), cfg outbox.MiddlewareConfig) (pipeline, error) {
	var tracked []outbox.Tracked
	for _, t := range topics(publishers) {
		tracked = append(tracked, outbox.Tracked{Topic: t, Store: store})
	}
	reg, err := outbox.NewRegistry(tracked...)
	if err != nil {
		return pipeline{}, err
	}
	return outboxPipelineWith(reg, cleanup, cfg)
}
