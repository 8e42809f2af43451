package outbox

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmoutbox/outbox/internal/pages"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/recordstore"
)

// DefaultMaxPageBytes is the byte budget of one page of replay and of one
// claim of the stale resubmitter: 16 MiB of payloads and metadata.
const DefaultMaxPageBytes = 16 << 20

// ReplayConfig configures [Replay] and [ReplayPlugin].
type ReplayConfig struct {
	// PageSize is the most pending records read per query; replay holds
	// at most five pages in memory (the one being read, the next one, the
	// one being sent, and up to two sent and being recorded as sent),
	// whatever the backlog. Defaults to 500.
	PageSize int

	// MaxPageBytes bounds a page by the bytes of its payloads and
	// metadata: a page ends with the record that reaches it, so replay
	// holds at most five times MaxPageBytes plus five records, whatever
	// the backlog and its payloads. The bound is exact on a store that
	// implements [recordstore.ByteBoundedReader] (sqlstore does); with
	// another store the first page may exceed it, and the following ones
	// ask for as many records as fitted. Defaults to [DefaultMaxPageBytes]
	// (16 MiB).
	MaxPageBytes int

	// AfterRunning makes [ReplayPlugin] replay in the background once the
	// router is running, instead of inside the last handler's Subscribe
	// call. Use it when a subscriber holds locks or waits while subscribing,
	// so that a replayed message cannot be accepted before its handler
	// consumes: watermill-sql on MySQL/MariaDB (the subscriber locks the end
	// of the topic table), or a GoChannel with BlockPublishUntilSubscriberAck.
	// A failed replay then closes the router and is passed to OnError; Run
	// returns nil. Defaults to false: replay is part of the start and its
	// failure is returned by Run.
	AfterRunning bool

	// OnError receives the error of a failed replay in AfterRunning mode,
	// after the router was closed. Defaults to nothing beyond the log line.
	OnError func(error)

	// Mode chooses what a start replays. Defaults to [ReplayAuto]: every
	// pending record on a GoChannel, which loses what it holds at a crash,
	// and by claims ([ReplayClaimed]) on every other broker, so that a
	// crash loop does not multiply the copies in durable queues.
	Mode ReplayMode

	// ClaimGrace is the grace of a replay by claims ([ReplayClaimed]), on
	// a store that implements [recordstore.StaleClaimer]: the replay skips
	// records sent less than ClaimGrace ago by the database clock (by an
	// earlier start, the stale resubmitter or another running instance),
	// which are still in the broker or being delivered, and claims what it
	// sends, so that instances starting together send each record about
	// once and a service restarting in a loop resends each record at most
	// once per ClaimGrace. A record never sent again after its publish is
	// sent whatever its age (see [recordstore.ReplayClaimer]), and a record
	// it skips is resent by the stale resubmitter once it is older than
	// its OlderThan. Choose it longer than a delivery normally takes.
	// Defaults to Resubmit.OlderThan (5 minutes).
	ClaimGrace time.Duration

	// Resubmit configures the [StaleResubmitter] that [ReplayPlugin] runs
	// while the router runs, which resends the records whose send was lost
	// or that were requeued (outboxctl requeue) without waiting for the
	// next start. Defaults to [StaleResubmitterConfig]'s defaults.
	Resubmit StaleResubmitterConfig

	// NoResubmit stops [ReplayPlugin] from running a stale resubmitter,
	// for a service that runs its own [StaleResubmitter] (with another
	// publisher, say) or none. Records skipped by a replay by claims then
	// wait for a resubmitter or a later start. Defaults to false.
	NoResubmit bool

	// StatementTimeout bounds each database statement of the replay (the
	// store checks, the table identity read, each page read or claim, each
	// send-time stamp), so that a database that accepts connections and
	// never answers makes the replay fail with a [*ResendError] (or a
	// [*VerifyError]), aborting the start, instead of hanging it. Defaults
	// to [DefaultStatementTimeout] (30 seconds).
	StatementTimeout time.Duration
}

func (c *ReplayConfig) setDefaults() {
	c.Resubmit.setDefaults()
	if c.ClaimGrace == 0 {
		c.ClaimGrace = c.Resubmit.OlderThan
	}
	if c.PageSize == 0 {
		c.PageSize = 500
	}
	if c.MaxPageBytes == 0 {
		c.MaxPageBytes = DefaultMaxPageBytes
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
}

// Validate reports a configuration error, if any.
func (c ReplayConfig) Validate() error {
	if c.PageSize < 1 {
		return fmt.Errorf("%w: PageSize %d must be positive", ErrInvalidConfig, c.PageSize)
	}
	if c.MaxPageBytes < 1 {
		return fmt.Errorf("%w: MaxPageBytes %d must be positive", ErrInvalidConfig, c.MaxPageBytes)
	}
	if c.ClaimGrace < 0 {
		return fmt.Errorf("%w: ClaimGrace %v is negative", ErrInvalidConfig, c.ClaimGrace)
	}
	if c.StatementTimeout < 0 {
		return fmt.Errorf("%w: StatementTimeout %v is negative", ErrInvalidConfig, c.StatementTimeout)
	}
	if c.Mode < ReplayAuto || c.Mode > ReplayClaimed {
		return fmt.Errorf("%w: Mode %d is not a ReplayMode", ErrInvalidConfig, c.Mode)
	}
	if err := c.Resubmit.Validate(); err != nil {
		return fmt.Errorf("replay's Resubmit: %w", err)
	}
	return nil
}

// ReplayMode chooses what a start replays: see [ReplayConfig.Mode].
type ReplayMode int

const (
	// ReplayAuto replays every pending record ([ReplayAll]) when the
	// publisher, under every wrapper that has an Unwrap() message.Publisher
	// method, is a GoChannel, and by claims ([ReplayClaimed]) otherwise.
	ReplayAuto ReplayMode = iota
	// ReplayAll sends every pending record at every start: what a broker
	// without persistence needs, which loses at a crash what it held (a
	// GoChannel, an AMQP queue that is deleted with its consumer). On a
	// durable broker each start adds one copy of the whole backlog to its
	// queues.
	ReplayAll
	// ReplayClaimed sends, at start, the pending records never sent again
	// after their publish and those last sent more than ClaimGrace ago,
	// claiming them, on a store that implements [recordstore.StaleClaimer]
	// (a store without claims replays all). On a durable broker a record
	// then gets at most one copy from the first start after its publish,
	// and one per ClaimGrace after, however often the service restarts.
	ReplayClaimed
)

// mode is the replay mode for pub, ReplayAuto resolved.
func (c ReplayConfig) mode(pub message.Publisher) ReplayMode {
	if c.Mode != ReplayAuto {
		return c.Mode
	}
	if losesOnCrash(pub) {
		return ReplayAll
	}
	return ReplayClaimed
}

// losesOnCrash reports whether the publisher at the bottom of pub's chain
// of wrappers is a GoChannel, which keeps its messages in memory only.
func losesOnCrash(pub message.Publisher) bool {
	for range maxWrappers {
		if _, ok := pub.(*gochannel.GoChannel); ok {
			return true
		}
		u, ok := pub.(interface{ Unwrap() message.Publisher })
		if !ok {
			return false
		}
		if pub = u.Unwrap(); pub == nil {
			return false
		}
	}
	return false
}

// ResendResult counts the records [Replay] republished, per tracked topic.
type ResendResult map[string]int

// Total is the number of records replayed across names.
func (r ResendResult) Total() int {
	n := 0
	for _, c := range r {
		n += c
	}
	return n
}

// Replay republishes every pending record of every tracked topic through pub,
// the publisher the messages were published through (decorated or not: records are never saved again), with the record's id, UUID,
// payload and metadata. It reads each topic's records in pages ordered by id
// and stops at the first record it cannot read or send, returning a
// [*ResendError] that names it.
//
// Before anything is sent, every distinct store that implements [recordstore.Verifier]
// is verified; a store that is not ready makes Replay return a
// [*VerifyError] and send nothing. Each store that implements
// [recordstore.ConsumerDeclarer] records the consumers its topics declare.
// Then each consumer with pending
// deliveries of a tracked topic that the topic does not declare (removed or
// renamed) is logged at Error with the fix, [RetireConsumer], on a store
// that implements [recordstore.StatusReader].
//
// Call it only once the subscriptions that receive the messages exist: a
// broker without persistence (GoChannel), an unbound AMQP queue or a new
// consumer group loses what is sent before. [ReplayPlugin] does that for a
// router.
func Replay(ctx context.Context, reg *Registry, pub message.Publisher, cfg ReplayConfig, logger watermill.LoggerAdapter) (ResendResult, error) {
	r, err := newReplayer(reg, pub, cfg, logger)
	if err != nil {
		return nil, err
	}
	return r.run(ctx)
}

type replayer struct {
	reg    *Registry
	out    *resender
	cfg    ReplayConfig
	mode   ReplayMode // cfg.Mode, ReplayAuto resolved for the publisher
	logger watermill.LoggerAdapter
	shared sharedSubscribers
}

func newReplayer(reg *Registry, pub message.Publisher, cfg ReplayConfig, logger watermill.LoggerAdapter) (*replayer, error) {
	out, err := newResender(reg, pub, observe.ResendReplay)
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	reg.reportDisabled(logger)
	return &replayer{reg: reg, out: out, cfg: cfg, mode: cfg.mode(pub), logger: logger}, nil
}

func (r *replayer) run(ctx context.Context) (ResendResult, error) {
	result := ResendResult{}
	if !r.reg.enabled {
		return result, nil
	}
	if err := r.verify(ctx); err != nil {
		r.logger.Error("Replay aborted: a store is not ready", err, nil)
		return result, err
	}
	r.declare(ctx)
	r.reportUndeclared(ctx)
	for _, t := range r.reg.entries() {
		name := t.topic
		n, err := r.replayName(ctx, t)
		result[name] = n
		if err != nil {
			r.logger.Error("Replay aborted", err, watermill.LogFields{"topic": name, "replayed": n})
			return result, err
		}
		r.logger.Info("Replayed pending records", watermill.LogFields{"topic": name, "replayed": n})
	}
	return result, nil
}

// verify asks each distinct store that implements [recordstore.Verifier] to check itself.
func (r *replayer) verify(ctx context.Context) error {
	for _, t := range r.reg.stores() {
		v, ok := t.store.(recordstore.Verifier)
		if !ok {
			continue
		}
		vctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
		err := v.Verify(vctx)
		cancel()
		if err != nil {
			return &VerifyError{Topic: t.topic, Err: err}
		}
	}
	return nil
}

// sameStore compares two stores without panicking on a store type that is
// not comparable (such stores are taken as distinct).
func sameStore(a, b recordstore.Store) bool {
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// page is one read of pending records, handed from the reader to the sender.
type page struct {
	records []recordstore.Record
	err     error
}

// replayName streams the pending records of one name: a reader goroutine
// fetches the next page while the current one is sent, and a stamper
// records the previous one as sent, through channels of one page each, so
// memory stays at five pages whatever the backlog (see PageSize).
func (r *replayer) replayName(ctx context.Context, t *tracked) (int, error) {
	name, store := t.topic, t.store
	id, err := identityWithin(ctx, r.cfg.StatementTimeout, t)
	if err != nil {
		return 0, err
	}
	if claimer, ok := store.(recordstore.StaleClaimer); ok && r.mode == ReplayClaimed {
		return r.replayClaimed(ctx, t, claimer, id)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	read := make(chan page, 1)
	go func() {
		defer close(read)
		var after int64
		reads := pages.New(r.cfg.PageSize, r.cfg.MaxPageBytes)
		for {
			rctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
			recs, more, err := reads.Pending(rctx, store, name, after)
			cancel()
			if err != nil {
				select {
				case read <- page{err: err}:
				case <-ctx.Done():
				}
				return
			}
			if len(recs) == 0 {
				return
			}
			select {
			case read <- page{records: recs}:
			case <-ctx.Done():
				return
			}
			if !more {
				return
			}
			after = recs[len(recs)-1].ID
		}
	}()

	// A third goroutine stamps the pages sent, while the next one is sent.
	stamps := make(chan []recordstore.Record, 1)
	stamped := make(chan struct{})
	go func() {
		defer close(stamped)
		for recs := range stamps {
			r.stampSent(ctx, name, store, recs)
		}
	}()
	sent, lastID, err := r.sendPages(ctx, t, id, read, stamps)
	close(stamps)
	<-stamped
	if err != nil {
		return sent, err
	}
	if err := ctx.Err(); err != nil {
		return sent, &ResendError{Topic: name, AfterID: lastID, Err: err}
	}
	return sent, nil
}

// sendPages sends the pages read and hands each one sent to stamps.
func (r *replayer) sendPages(ctx context.Context, t *tracked, identity string, pages <-chan page, stamps chan<- []recordstore.Record) (sent int, lastID int64, err error) {
	for p := range pages {
		if p.err != nil {
			return sent, lastID, &ResendError{Topic: t.topic, AfterID: lastID, Err: p.err}
		}
		if err := r.out.send(ctx, t, identity, p.records); err != nil {
			return sent, lastID, err
		}
		sent += len(p.records)
		lastID = p.records[len(p.records)-1].ID
		select {
		case stamps <- p.records:
		case <-ctx.Done():
			return sent, lastID, &ResendError{Topic: t.topic, AfterID: lastID, Err: ctx.Err()}
		}
	}
	return sent, lastID, nil
}

// ReplayPlugin returns a router plugin that runs [Replay] as part of starting
// the router, once every handler's subscription is open and before
// Router.Running is closed.
//
// A replay that fails aborts the start: Router.Run returns the
// [*ResendError], or the [*VerifyError] of a store that is not ready (wrapped
// by the router), without the service ever counting as started, as it does
// when a subscription fails; the handlers already
// subscribed stop with Run's context. Like any router whose Run failed, it
// cannot be run again: build a new one to retry.
//
// While the router runs, the plugin also runs a [StaleResubmitter]
// configured by ReplayConfig.Resubmit, which resends the records whose
// send was lost or that were requeued, unless ReplayConfig.NoResubmit is
// set. A router without handlers runs none: call [StaleResubmitter.Run].
//
// The replay runs inside the last handler's Subscribe call, before that
// handler consumes: a publisher that waits for the message to be handled, or
// a subscriber that locks what the replay writes, would wait for a handler
// that has not started. For those set ReplayConfig.AfterRunning. A router
// without handlers replays after it is running and closes itself on failure.
//
// A start that fails leaves none of the outbox's goroutines behind: what
// the replay sent into the last subscription before it failed, which no
// handler reads, is nacked until the subscription closes, and its records
// stay pending. With Watermill 1.5.1 the router itself leaves one
// goroutine (watchAllHandlersStopped) after a Run that failed once a
// handler had subscribed, which a failed replay is, and its Close then
// times out: a service exits after a failed start rather than retrying
// in-process.
func ReplayPlugin(reg *Registry, pub message.Publisher, cfg ReplayConfig, logger watermill.LoggerAdapter) message.RouterPlugin {
	return func(router *message.Router) error {
		r, err := newReplayer(reg, pub, cfg, logger)
		if err != nil {
			return err
		}
		reg.background.Draining.Store(false)
		router.AddPublisherDecorators(func(pub message.Publisher) (message.Publisher, error) {
			return &closingPublisher{Publisher: pub, reg: reg}, nil
		})
		expected := len(router.Handlers())
		var gate *subscribeGate
		switch {
		case expected == 0:
			// Nothing subscribes: only a later plugin can fail the start.
			go r.afterRunning(router)
		case r.cfg.AfterRunning:
			// Waits on the subscriptions' context too, so that a start
			// that fails (a subscription refused) leaves no goroutine
			// waiting for a router that will never run.
			err := runWithRouter(reg, func(context.Context) error {
				r.afterRunning(router)
				return nil
			})(router)
			if err != nil {
				return err
			}
		default:
			gate = &subscribeGate{expected: expected, replay: func(ctx context.Context) error {
				r.reportUncompleted(router)
				_, err := r.run(ctx)
				return err
			}}
		}
		router.AddSubscriberDecorators(func(sub message.Subscriber) (message.Subscriber, error) {
			return &replayingSubscriber{Subscriber: sub, gate: gate, r: r}, nil
		})
		if r.cfg.NoResubmit || expected == 0 {
			return nil
		}
		resubmitter, err := NewStaleResubmitter(reg, pub, r.cfg.Resubmit, logger)
		if err != nil {
			return err
		}
		return resubmitter.Plugin()(router)
	}
}

func (r *replayer) afterRunning(router *message.Router) {
	<-router.Running()
	if router.IsClosed() {
		return
	}
	r.reportUncompleted(router)
	if _, err := r.run(context.Background()); err != nil {
		if cerr := router.Close(); cerr != nil {
			r.logger.Error("Closing router after failed replay", cerr, nil)
		}
		if r.cfg.OnError != nil {
			r.cfg.OnError(err)
		}
	}
}

// subscribeGate counts the router's Subscribe calls and replays after the
// last one.
type subscribeGate struct {
	mu         sync.Mutex
	expected   int
	subscribed int
	done       bool
	replay     func(context.Context) error
}

func (g *subscribeGate) subscribed1(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.subscribed++
	if g.done || g.subscribed < g.expected {
		return nil
	}
	g.done = true
	return g.replay(ctx)
}

// replayingSubscriber is the router's subscriber of one handler: it counts
// the subscriptions to each tracked topic, and replays after the last one
// when gate is set.
type replayingSubscriber struct {
	message.Subscriber
	gate *subscribeGate
	r    *replayer
}

func (s *replayingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ch, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	s.r.countSubscription(topic)
	if t := s.r.reg.lookup(topic); t != nil {
		s.r.shared.subscribed(t, s.Subscriber, s.r.logger)
	}
	if s.gate == nil {
		return ch, nil
	}
	if err := s.gate.subscribed1(ctx); err != nil {
		s.r.reg.background.Spawn(func() { drain(ctx, ch) })
		return nil, fmt.Errorf("startup replay: %w", err)
	}
	return ch, nil
}

// drain nacks what a subscription whose start failed delivers, until the
// subscriber closes it. No handler reads it, and what the replay sent into
// it would otherwise hold the goroutines that deliver it (the router's
// decorator of the subscription among them) for ever; its records stay
// pending for the next start. It nacks only once the subscription's
// context ended (the router cancels it when Subscribe fails), so that a
// broker that redelivers a nacked message at once does so only until it
// sees that end.
func drain(ctx context.Context, ch <-chan *message.Message) {
	<-ctx.Done()
	for msg := range ch {
		msg.Nack()
	}
}

// stampSent tells a store that records the last send that the page was
// sent. A failure only makes the stale resubmitter resend the page sooner,
// so it is logged, not returned.
func (r *replayer) stampSent(ctx context.Context, name string, store recordstore.Store, recs []recordstore.Record) {
	st, ok := store.(recordstore.SendStamper)
	if !ok {
		return
	}
	ids := make([]int64, len(recs))
	for i, rec := range recs {
		ids[i] = rec.ID
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
	defer cancel()
	if err := st.StampSent(ctx, ids); err != nil {
		r.logger.Error("Recording the replay's send time failed; the stale resubmitter may resend these records sooner", err,
			watermill.LogFields{"topic": name, "first_id": ids[0], "last_id": ids[len(ids)-1]})
	}
}

// countSubscription detects, at start, a second handler subscribing to a
// tracked topic that declares no consumers: the router does not say which
// handler subscribes, so the names are logged at each one's first message.
func (r *replayer) countSubscription(topic string) {
	t := r.reg.lookup(topic)
	if t == nil {
		return
	}
	t.subscribed.Store(true)
	if len(t.consumers) > 0 {
		return
	}
	if n := t.subscriptions.Add(1); n == 2 {
		r.logger.Error("Two handlers subscribe to a tracked topic that declares no consumers", fmt.Errorf(
			"%w: topic %q has %d subscriptions in this service; declare the handler names in Tracked.Consumers so that each handles every message, "+
				"or the second handler runs untracked", ErrInvalidConfig, topic, n), watermill.LogFields{"topic": topic})
	}
}

// replayClaimed replays by claiming pages of records never sent again
// after their publish or not sent for ClaimGrace: the claim stamps them as
// sent, so another instance replaying at the same moment claims other
// records, and no start claims them again before ClaimGrace has passed.
func (r *replayer) replayClaimed(ctx context.Context, t *tracked, claimer recordstore.StaleClaimer, identity string) (int, error) {
	sent := 0
	var after int64 // the cursor: each record is claimed once, whatever ClaimGrace
	reads := pages.New(r.cfg.PageSize, r.cfg.MaxPageBytes)
	for {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
		recs, more, err := reads.Replay(cctx, claimer, t.topic, after, r.cfg.ClaimGrace)
		cancel()
		if err != nil {
			return sent, &ResendError{Topic: t.topic, Err: fmt.Errorf("claiming pending records: %w", err)}
		}
		if len(recs) > 0 {
			after = recs[len(recs)-1].ID
			if err := r.out.send(ctx, t, identity, recs); err != nil {
				return sent, err
			}
			sent += len(recs)
		}
		if !more {
			return sent, nil
		}
	}
}

// reportUncompleted logs, at start, each tracked topic whose records
// nothing will complete as the registry and the router are set up: no
// handler of the router receives it and it declares no receiver elsewhere,
// or its remote consumers' confirmations have no handler.
func (r *replayer) reportUncompleted(router *message.Router) {
	handlers := router.Handlers()
	for _, t := range r.reg.entries() {
		if t.completedBy != ByReceivers {
			continue
		}
		if len(t.deliveries) == 0 && !t.subscribed.Load() {
			r.logger.Error("Nothing will complete the records of a tracked topic", fmt.Errorf(
				"%w: no handler of this router receives tracked topic %q, and it declares no receivers elsewhere: its records stay pending and are resent for ever. "+
					"Declare who completes them: Tracked.Consumers for handlers in services that share this store, "+
					"Tracked.RemoteConsumers for handlers in services with a database of their own (they confirm over the broker), "+
					"or CompletedBy: outbox.OnSend for receivers that do not run the outbox", ErrInvalidConfig, t.topic),
				watermill.LogFields{"topic": t.topic})
		}
		if t.confirmTo != "" && handlers[ConfirmationHandlerName+":"+t.confirmTo] == nil {
			r.logger.Error("The remote consumers' confirmations of a tracked topic are not consumed", fmt.Errorf(
				"%w: tracked topic %q declares remote consumers %q, but this router has no handler of their confirmations on %q: its records stay pending. "+
					"Add outbox.AddConfirmationHandler(router, reg, subscriber, logger)", ErrInvalidConfig, t.topic, t.remote, t.confirmTo),
				watermill.LogFields{"topic": t.topic, "confirm_topic": t.confirmTo})
		}
	}
}
