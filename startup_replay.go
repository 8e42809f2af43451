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

	"github.com/wmoutbox/outbox/internal/loop"
	"github.com/wmoutbox/outbox/internal/pages"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/recordstore"
)

// ReplayConfig configures [Replay] and [ReplayPlugin].
type ReplayConfig struct {
	// PageSize is the most pending records read per query; replay holds
	// at most five pages in memory. Defaults to 500.
	PageSize int
	// MaxPageBytes ends a page with the record whose payload and metadata
	// reach it (exactly on a [recordstore.ByteBoundedReader]). Defaults to
	// [DefaultMaxPageBytes] (16 MiB).
	MaxPageBytes int
	// AfterRunning makes [ReplayPlugin] replay once the router runs,
	// instead of inside the last handler's Subscribe, for subscribers that
	// hold locks while subscribing (watermill-sql on MySQL/MariaDB, a
	// GoChannel with BlockPublishUntilSubscriberAck). A failed replay then
	// closes the router and goes to OnError. Defaults to false.
	AfterRunning bool
	// OnError receives the error of a failed replay with AfterRunning.
	// Defaults to nothing beyond the log line.
	OnError func(error)
	// Mode chooses what a start replays. Defaults to [ReplayAuto]: every
	// pending record on a GoChannel, by claims on every other broker.
	Mode ReplayMode
	// ClaimGrace is how recent a send must be for a replay by claims to
	// skip its record (it is still in the broker); choose it longer than a
	// delivery normally takes. Defaults to Resubmit.OlderThan (5 minutes).
	ClaimGrace time.Duration
	// Resubmit configures the [StaleResubmitter] that [ReplayPlugin] runs
	// while the router runs. Defaults to [StaleResubmitterConfig]'s
	// defaults.
	Resubmit StaleResubmitterConfig
	// NoResubmit stops [ReplayPlugin] from running a stale resubmitter,
	// for a service that runs its own or none; the records of order keys
	// that a consumer held are still sent again, through the plugin's
	// publisher. Defaults to false.
	NoResubmit bool
	// StatementTimeout bounds each database statement of the replay; one
	// that runs out aborts the start with a [*ResendError] or a
	// [*VerifyError]. Defaults to [DefaultStatementTimeout] (30 seconds).
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
	// ReplayAuto is [ReplayAll] on a GoChannel (under its wrappers) and
	// [ReplayClaimed] on any other publisher.
	ReplayAuto ReplayMode = iota
	// ReplayAll sends every pending record at every start, as a broker
	// without persistence needs; on a durable one each start adds a copy
	// of the backlog.
	ReplayAll
	// ReplayClaimed claims and sends the pending records never sent again
	// and those last sent more than ClaimGrace ago ([recordstore.StaleClaimer];
	// a store without claims replays all).
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

// Replay republishes every pending record of every tracked topic through
// pub (decorated or not: records are never saved again), with the record's
// id, UUID, payload and metadata, in pages ordered by id; it stops at the
// first record it cannot read or send and returns a [*ResendError] naming
// it. A store that is not ready (recordstore.Verifier) makes it return a
// [*VerifyError] before anything is sent. It logs each consumer with
// pending deliveries that its topic no longer declares. Call it only once
// the subscriptions that receive the messages exist; [ReplayPlugin] does
// that for a router.
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

// ReplayPlugin returns a router plugin that runs [Replay] as part of
// starting the router, once every handler's subscription is open and before
// Router.Running is closed: a failed replay aborts the start, and Router.Run
// returns its [*ResendError] (or the [*VerifyError] of a store not ready);
// build a new router to retry. While the router runs it also runs a
// [StaleResubmitter] (ReplayConfig.Resubmit), unless NoResubmit. The replay
// runs inside the last handler's Subscribe call; for subscribers that lock
// or wait while subscribing set ReplayConfig.AfterRunning.
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
				r.markUnreceived()
				r.reportUncompleted(router)
				_, err := r.run(ctx)
				return err
			}}
		}
		router.AddSubscriberDecorators(func(sub message.Subscriber) (message.Subscriber, error) {
			return &replayingSubscriber{Subscriber: sub, gate: gate, r: r}, nil
		})
		if expected == 0 {
			return nil
		}
		if r.cfg.NoResubmit {
			return heldRecordSender(reg, pub)(router)
		}
		resubmitter, err := NewStaleResubmitter(reg, pub, r.cfg.Resubmit, logger)
		if err != nil {
			return err
		}
		return resubmitter.Plugin()(router)
	}
}

// heldRecordSender sends, while the router runs, the next records of order
// keys that consumers held, which a stale resubmitter sends otherwise. It
// is the registry's sender from the router's first subscription, before
// any confirmation or copy is handled, until the router closes.
func heldRecordSender(reg *Registry, pub message.Publisher) message.RouterPlugin {
	return func(router *message.Router) error {
		res, err := newResender(reg, pub, observe.ResendResubmit)
		if err != nil {
			return err
		}
		return loop.OnSubscribe(errNoHandlers, func(ctx context.Context) {
			context.AfterFunc(ctx, reg.running(res))
		})(router)
	}
}

func (r *replayer) afterRunning(router *message.Router) {
	<-router.Running()
	if router.IsClosed() {
		return
	}
	r.markUnreceived()
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
	t.unreceived.Store(false)
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
	reads := pages.New(r.cfg.PageSize, r.cfg.MaxPageBytes)
	claim := func(ctx context.Context, after int64) ([]recordstore.Record, bool, error) {
		return reads.Replay(ctx, claimer, t.topic, after, r.cfg.ClaimGrace)
	}
	return r.out.sendClaimed(ctx, t, identity, r.cfg.StatementTimeout, "pending records", claim, nil)
}

// markUnreceived marks, once every handler of the router subscribed, the
// tracked topics that none receives (tracked.receivedHere). A handler of
// another router may subscribe meanwhile (countSubscription sets
// subscribed, then clears unreceived): the mark is taken back when
// subscribed was set before it, and cleared after it otherwise.
func (r *replayer) markUnreceived() {
	for _, t := range r.reg.entries() {
		if !t.subscribed.Load() {
			t.unreceived.Store(true)
			if t.subscribed.Load() {
				t.unreceived.Store(false)
			}
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
		if t.completedBy != ByConsumers {
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

// sharedSubscribers detects, at start, two handlers of a tracked topic that
// declares consumers subscribing through one subscriber value. Every
// broker but GoChannel gives the subscriptions of one subscriber one queue
// or consumer group (its configuration names it), so the handlers split the
// messages between them: each consumer gets about half, and every record
// stays pending for the other. Handlers in different processes that share a
// queue or group cannot be seen from here; docs/brokers.md says to give
// each consumer its own.
type sharedSubscribers struct {
	mu   sync.Mutex
	seen map[sharedKey]int
}

type sharedKey struct {
	topic string
	typ   reflect.Type
	ptr   uintptr
}

var goChannelType = reflect.TypeOf((*gochannel.GoChannel)(nil))

// maxUnwrap bounds the walk down a chain of subscriber wrappers.
const maxUnwrap = 8

// underlying is the subscriber under the wrappers a router puts around
// each handler's (Watermill's own context decorator, the outbox's and
// others' decorators): structs that hold the next subscriber in a field
// named sub or Subscriber. It returns the type and address of the first
// subscriber that is no such wrapper, or ok false when it is not a pointer.
func underlying(sub message.Subscriber) (reflect.Type, uintptr, bool) {
	v := reflect.ValueOf(sub)
	for range maxUnwrap {
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			return nil, 0, false
		}
		next := v.Elem().FieldByName("sub")
		if !next.IsValid() {
			next = v.Elem().FieldByName("Subscriber")
		}
		if !next.IsValid() || next.Kind() != reflect.Interface || next.IsNil() {
			return v.Type(), v.Pointer(), true
		}
		v = next.Elem()
	}
	return nil, 0, false
}

// subscribed counts a subscription to a tracked topic with declared
// consumers, and logs the second one through the same subscriber.
func (s *sharedSubscribers) subscribed(t *tracked, sub message.Subscriber, logger watermill.LoggerAdapter) {
	if len(t.consumers) < 2 || sub == nil {
		return
	}
	typ, ptr, ok := underlying(sub)
	if !ok || typ == goChannelType {
		return // each Subscribe of a GoChannel gets every message
	}
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[sharedKey]int{}
	}
	k := sharedKey{topic: t.topic, typ: typ, ptr: ptr}
	s.seen[k]++
	n := s.seen[k]
	s.mu.Unlock()
	if n == 2 {
		logger.Error("Two declared consumers of a tracked topic subscribe through one subscriber", fmt.Errorf(
			"%w: %d handlers of tracked topic %q, which declares consumers %q, subscribe through one %v; unless that pub/sub gives every subscription all messages, "+
				"they share its queue or consumer group and split the messages, and every record stays pending for the consumer that did not get it. "+
				"Give each consumer a subscriber of its own queue or group (docs/brokers.md)", ErrInvalidConfig, n, t.topic, t.consumers, typ),
			watermill.LogFields{"topic": t.topic})
	}
}

// declare records, in each distinct store that keeps declarations
// ([recordstore.ConsumerDeclarer]), the consumers that this start declares
// for each tracked topic of the store, local and remote, so that tools
// without the registry (outboxctl, the dashboard) refuse to retire a
// consumer still declared and tell the remote ones. A store that cannot
// write them keeps its previous declarations: the failure is logged, not
// returned, since no record depends on it.
func (r *replayer) declare(ctx context.Context) {
	for _, first := range r.reg.stores() {
		d, ok := first.store.(recordstore.ConsumerDeclarer)
		if !ok {
			continue
		}
		var decls []recordstore.Declaration
		for _, t := range r.reg.entries() {
			if sameStore(t.store, first.store) {
				decls = append(decls, recordstore.Declaration{Topic: t.topic, Consumers: t.consumers, RemoteConsumers: t.remote})
			}
		}
		dctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
		err := d.DeclareConsumers(dctx, decls)
		cancel()
		if err != nil {
			r.logger.Error("Recording the declared consumers failed; operators' tools go by the previous start's", err,
				watermill.LogFields{"topic": first.topic})
		}
	}
}

// reportUndeclared logs at Error each consumer that has pending
// deliveries of a tracked topic and is not one of the consumers the topic
// declares: a consumer removed or renamed, whose deliveries keep their
// records pending for ever until it is retired. It reads the pending
// status of each distinct store that reports one (one query over the
// pending deliveries); a store that cannot is passed over, and a failed
// read is logged, not returned: replay reads the same records next.
func (r *replayer) reportUndeclared(ctx context.Context) {
	for _, first := range r.reg.stores() {
		sr, ok := first.store.(recordstore.StatusReader)
		if !ok {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
		statuses, err := sr.PendingStatus(sctx)
		cancel()
		if err != nil {
			r.logger.Error("Reading the pending deliveries failed; consumers no longer declared are not reported", err, watermill.LogFields{"topic": first.topic})
			continue
		}
		for _, st := range statuses {
			t := r.reg.lookup(st.Topic)
			if t == nil || !sameStore(t.store, first.store) {
				continue
			}
			for _, c := range st.Consumers {
				if c.Pending == 0 || t.hasDelivery(c.Consumer) {
					continue
				}
				r.logger.Error("Pending deliveries of a consumer the topic no longer declares", undeclaredConsumer(t, c),
					watermill.LogFields{"topic": t.topic, "consumer": c.Consumer, "pending": c.Pending})
			}
		}
	}
}

// undeclaredConsumer says what reportUndeclared found, and the fix.
func undeclaredConsumer(t *tracked, c recordstore.ConsumerStatus) error {
	declared := "no consumers"
	if len(t.deliveries) > 0 {
		declared = fmt.Sprintf("consumers %q", t.deliveries)
	}
	return fmt.Errorf("consumer %q has %d pending deliveries of tracked topic %q, which declares %s: their records stay pending and are sent again at every start. "+
		"If it was removed, or renamed and the new name has caught up, retire it: outboxops.RetireConsumer(ctx, reg, %q, %q), or outboxctl retire -topic %q -consumer %q. "+
		"If it still runs, declare it in Tracked.Consumers",
		c.Consumer, c.Pending, t.topic, declared, t.topic, c.Consumer, t.topic, c.Consumer)
}
