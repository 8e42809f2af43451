package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/wmoutbox/outbox/recordstore"
)

// MiddlewareConfig configures [NewMiddleware].
type MiddlewareConfig struct {
	// FetchTimeout bounds the check before the handler (reading, or
	// claiming, the record). When it runs out the middleware returns a
	// [*FetchError] (nack) without running the handler, so that a database
	// that accepts connections but never answers cannot hold a delivery.
	// Defaults to 10 seconds.
	FetchTimeout time.Duration
	// CompleteTimeout bounds the mark (or delete) after the handler. It runs
	// on a context that keeps the message context's values but not its
	// cancellation, so that a router shutting down still completes the
	// records of handlers that finished. Defaults to 10 seconds.
	CompleteTimeout time.Duration

	// LeasedNackDelay is how long the middleware holds a copy whose record
	// another delivery has leased (a store with a delivery lease, see
	// [recordstore.Releaser]) before it nacks it, so that a broker that redelivers at
	// once (GoChannel, an AMQP requeue) does not spin against the database
	// while the first delivery runs. Defaults to 50 milliseconds.
	LeasedNackDelay time.Duration
	// MaxAttempts abandons a record after this many failed handlings, on a
	// store that implements [recordstore.FailureRecorder]: the record is kept, no longer
	// pending, and the middleware returns an [*AbandonedError]. Each failure
	// is counted, with its error text, whatever MaxAttempts is; a
	// successful handling costs nothing extra. Defaults to 0, which never
	// abandons.
	MaxAttempts int
	// Backoff spaces the attempts of a failing delivery, on a store that
	// implements [recordstore.FailureRecorder]: the delivery is due again only after a
	// growing delay, kept in the database, and a copy that arrives earlier
	// is held until then and nacked without running the handler. Defaults
	// to [Backoff]'s defaults (500 ms doubling up to 1 minute, 20%
	// jitter).
	Backoff Backoff
	// OnAbandon, when set, is called with the message and the
	// [*AbandonedError] after a record is abandoned, before the middleware
	// returns; for example to publish the message somewhere else. Defaults
	// to nil.
	OnAbandon func(msg *message.Message, err *AbandonedError)
}

func (c *MiddlewareConfig) setDefaults() {
	if c.FetchTimeout == 0 {
		c.FetchTimeout = 10 * time.Second
	}
	if c.CompleteTimeout == 0 {
		c.CompleteTimeout = 10 * time.Second
	}
	if c.LeasedNackDelay == 0 {
		c.LeasedNackDelay = 50 * time.Millisecond
	}
	c.Backoff.setDefaults()
}

// Validate reports a configuration error, if any.
func (c MiddlewareConfig) Validate() error {
	if c.FetchTimeout < 0 {
		return fmt.Errorf("%w: FetchTimeout %v is negative", ErrInvalidConfig, c.FetchTimeout)
	}
	if c.CompleteTimeout < 0 {
		return fmt.Errorf("%w: CompleteTimeout %v is negative", ErrInvalidConfig, c.CompleteTimeout)
	}
	if c.LeasedNackDelay < 0 {
		return fmt.Errorf("%w: LeasedNackDelay %v is negative", ErrInvalidConfig, c.LeasedNackDelay)
	}
	if c.MaxAttempts < 0 {
		return fmt.Errorf("%w: MaxAttempts %d is negative", ErrInvalidConfig, c.MaxAttempts)
	}
	return c.Backoff.Validate()
}

// NewMiddleware returns the router middleware that completes the records of
// tracked messages. Add it before (outside of) Retry, and of a PoisonQueue
// that diverts dropped messages; a PoisonQueue that diverts abandoned ones
// ([IsAbandoned]) goes outside it.
//
// A message without [MetadataID] runs the handler untouched. A message with
// outbox metadata is this service's only when its table identity
// ([MetadataStore]) is the store of the topic the handler subscribed to and
// its [MetadataTopic] is that topic; any other (another service's tracked
// message, another topic's record) runs the handler untracked, touching no
// table. For its own messages the middleware:
//
//   - checks that the record is pending for this consumer (the handler
//     name), within FetchTimeout, on a connection it gives back before the
//     handler runs;
//   - already completed by this consumer: acknowledges without running the
//     handler;
//   - no such record in the table: acknowledges without running the
//     handler, and logs a warning;
//   - the check failed: returns a [*FetchError] (nack) without running the
//     handler;
//   - leased by another delivery (a store with a delivery lease): returns a
//     [*FetchError] (nack) after LeasedNackDelay, without running the
//     handler;
//   - runs the handler, then completes the consumer's delivery when the
//     handler succeeded or returned a [Drop] error (which is acknowledged),
//     or leaves it pending and returns the handler's error (nack),
//     releasing its lease;
//   - skips its own completion when the handler completed the record in its
//     transaction ([CompleteTx]);
//   - on a store that implements [recordstore.FailureRecorder], counts each failure with
//     its error text and, after [MiddlewareConfig.MaxAttempts] failures,
//     abandons the delivery and returns an [*AbandonedError] instead.
//
// # Several receivers
//
// A topic that declares its consumers ([Tracked.Consumers]) is checked and
// completed per consumer; a handler that is not declared runs untracked and
// is logged as an error. A topic without declared consumers has one
// receiver: a second handler that receives it is logged as an error, with
// the fix, and runs untracked, so that it never skips a message the first
// one completed.
//
// # Bounded
//
// No message makes the consumer spin: a failed handler makes the delivery
// due again only after [MiddlewareConfig.Backoff], and an early copy is held
// and nacked; a panic in the handler counts as a failed attempt (and goes
// on up to a Recoverer, or abandons after MaxAttempts); a malformed
// [MetadataID] is logged as an error and the handler runs once, untracked;
// the check has a deadline ([MiddlewareConfig.FetchTimeout]).
//
// A failed completion is logged; the handler's outcome stands and the record
// stays pending for the next replay.
//
// While the handler runs, the outbox keys are removed from the message
// metadata and the record is available from [RecordFromContext]; they are put
// back if the handler fails, so an outer Retry sees the message as delivered.
func NewMiddleware(reg *Registry, cfg MiddlewareConfig, logger watermill.LoggerAdapter) (message.HandlerMiddleware, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	reg.reportDisabled(logger)
	m := &middleware{reg: reg, cfg: cfg, logger: logger, leasePrefix: newLeasePrefix()}
	return m.wrap, nil
}

type middleware struct {
	reg    *Registry
	cfg    MiddlewareConfig
	logger watermill.LoggerAdapter
	// leasePrefix and leaseSeq make each delivery's lease token unique
	// across processes.
	leasePrefix string
	leaseSeq    atomic.Uint64
}

func newLeasePrefix() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails on supported platforms
	return hex.EncodeToString(b[:]) + "-"
}

func (m *middleware) wrap(h message.HandlerFunc) message.HandlerFunc {
	if !m.reg.enabled {
		return h
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		idText, ok := msg.Metadata[MetadataID]
		if !ok {
			return h(msg)
		}
		return m.handleTracked(h, msg, idText)
	}
}

// verdict is what admission decided for a message with outbox metadata.
type verdict int

const (
	run       verdict = iota // pending for this consumer: run and settle
	untracked                // not this service's, or not this consumer's: run, touch no table
	skip                     // already completed by this consumer: ack without running
	refuse                   // the check failed: nack without running
)

// admission is a tracked message on its way to the handler.
type admission struct {
	t      *tracked
	d      recordstore.Delivery
	idText string
	fields watermill.LogFields
}

func (m *middleware) handleTracked(h message.HandlerFunc, msg *message.Message, idText string) ([]*message.Message, error) {
	a, v, err := m.admit(msg, idText)
	switch v {
	case untracked:
		return h(msg)
	case skip:
		return nil, nil
	case refuse:
		return nil, err
	}
	return m.settle(h, msg, a)
}

// admit decides whether the message is this consumer's to handle and
// tracks, and checks its record.
func (m *middleware) admit(msg *message.Message, idText string) (*admission, verdict, error) {
	ctx := msg.Context()
	name := msg.Metadata[MetadataTopic]
	topic := message.SubscribeTopicFromCtx(ctx)
	if topic == "" {
		// Outside a router there is no subscription to trust.
		topic = name
	}
	consumer := message.HandlerNameFromCtx(ctx)
	t := m.reg.lookup(topic)
	if t == nil || name != topic {
		m.notOwned(msg, topic, consumer, "the message's topic is not tracked here, or its record is another topic's")
		return nil, untracked, nil
	}
	id, perr := parseID(idText)
	identity, err := m.identity(ctx, t)
	if err != nil {
		return nil, refuse, &FetchError{Topic: topic, ID: id, Err: fmt.Errorf("reading the table identity: %w", err)}
	}
	if msg.Metadata[MetadataStore] != identity {
		m.notOwned(msg, topic, consumer, "the record lives in another table")
		return nil, untracked, nil
	}
	if err := perr; err != nil {
		// Nacking would bring the same message back without end; it has
		// no record to complete, so it is handled once, untracked.
		m.logger.Error("Malformed outbox metadata; handling the message untracked", fmt.Errorf("message %s of %q: %w", msg.UUID, name, err),
			watermill.LogFields{"message_uuid": msg.UUID, "topic": name, "consumer": consumer})
		m.reg.observer().NotOwned(topic, consumer)
		return nil, untracked, nil
	}
	if !m.admitsConsumer(t, consumer) {
		m.reg.observer().NotOwned(topic, consumer)
		return nil, untracked, nil
	}
	a := &admission{t: t, idText: idText,
		d:      recordstore.Delivery{ID: id, Topic: topic, Consumer: consumer, Lease: m.leasePrefix + strconv.FormatUint(m.leaseSeq.Add(1), 36)},
		fields: watermill.LogFields{"message_uuid": msg.UUID, "topic": name, "outbox_id": id, "consumer": consumer}}
	v, err := m.check(ctx, a)
	return a, v, err
}

func (m *middleware) identity(ctx context.Context, t *tracked) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.FetchTimeout)
	defer cancel()
	return t.store.Identity(ctx)
}

// check reads the record's state for the delivery's consumer.
func (m *middleware) check(ctx context.Context, a *admission) (verdict, error) {
	cctx, cancel := context.WithTimeout(ctx, m.cfg.FetchTimeout)
	err := a.t.store.CheckPending(cctx, a.d)
	cancel()
	var conflict *recordstore.ConsumerConflictError
	var notDue *recordstore.NotDueError
	switch {
	case err == nil:
		return run, nil
	case errors.Is(err, ErrNotPending):
		m.logger.Debug("Record already completed, acking copy without handling", a.fields)
		m.reg.observer().DuplicateSkipped(a.t.name, a.d.Consumer)
		return skip, nil
	case errors.As(err, &conflict):
		m.conflict(a.t, a.d.Consumer, conflict.CompletedBy)
		m.reg.observer().NotOwned(a.t.name, a.d.Consumer)
		return untracked, nil
	case errors.Is(err, recordstore.ErrUnknownRecord):
		warn(m.logger, "No record with this id in the topic's table (never saved, or cleaned up); acking without handling", a.fields)
		m.reg.observer().UnknownRecord(a.t.name, a.d.Consumer)
		return skip, nil
	case errors.Is(err, recordstore.ErrNoDelivery):
		m.logger.Error("Record was saved before this consumer was declared; handling it untracked", err, a.fields)
		m.reg.observer().NotOwned(a.t.name, a.d.Consumer)
		return untracked, nil
	case errors.As(err, &notDue):
		m.logger.Debug("Record not due for its next attempt, holding and nacking the copy", a.fields.Add(watermill.LogFields{"wait": notDue.Wait}))
		m.hold(ctx, notDue.Wait)
		return refuse, err
	case errors.Is(err, recordstore.ErrLeased):
		m.logger.Debug("Record leased by another delivery, nacking copy without handling", a.fields)
		m.hold(ctx, m.cfg.LeasedNackDelay)
		return refuse, &FetchError{Topic: a.t.name, ID: a.d.ID, Err: err}
	}
	return refuse, &FetchError{Topic: a.t.name, ID: a.d.ID, Err: err}
}

// warner is a logger with a warning level, such as Watermill's slog
// adapter wrapped by the user; [watermill.LoggerAdapter] itself has none.
type warner interface {
	Warn(msg string, fields watermill.LogFields)
}

// warn logs at warning level where the logger has one, and at Info
// otherwise.
func warn(logger watermill.LoggerAdapter, msg string, fields watermill.LogFields) {
	if w, ok := logger.(warner); ok {
		w.Warn(msg, fields)
		return
	}
	logger.Info("WARNING: "+msg, fields)
}

// notOwned lets a message this service does not own through untracked.
// Receiving another service's tracked messages is normal, so it is counted
// and logged at Debug only.
func (m *middleware) notOwned(msg *message.Message, topic, consumer, why string) {
	m.logger.Debug("Message with outbox metadata this service does not own; handling it untracked", watermill.LogFields{
		"message_uuid": msg.UUID, "topic": topic, "consumer": consumer, "reason": why,
		"outbox_topic": truncate(msg.Metadata[MetadataTopic], 128), "outbox_id": truncate(msg.Metadata[MetadataID], 64),
	})
	m.reg.observer().NotOwned(topic, consumer)
}

// admitsConsumer reports whether the handler is the name's consumer: one of
// the declared consumers, or, without a declaration, the first handler seen
// receiving the name. Any other handler is logged once and runs untracked,
// so it never takes another consumer's completion for a duplicate.
func (m *middleware) admitsConsumer(t *tracked, consumer string) bool {
	if len(t.consumers) > 0 {
		if t.declares(consumer) {
			return true
		}
		m.reportOnce(t, consumer, "", fmt.Sprintf("handler %q receives tracked topic %q but is not one of its declared consumers %q; it runs untracked. Add it to Tracked.Consumers to track it",
			consumer, t.name, t.consumers))
		return false
	}
	if consumer == "" {
		// Outside a router the handler has no name to tell apart.
		return true
	}
	first := t.first.Load()
	if first == nil {
		// Deliveries that arrive together (a replay) race to be first;
		// every one of the winner's is the first receiver's too.
		if t.first.CompareAndSwap(nil, &consumer) {
			return true
		}
		first = t.first.Load()
	}
	if *first == consumer {
		return true
	}
	m.conflict(t, consumer, *first)
	return false
}

// conflict logs, once per pair, a second handler of a topic that declares
// no consumers.
func (m *middleware) conflict(t *tracked, consumer, other string) {
	m.reportOnce(t, consumer, other, fmt.Sprintf("handlers %q and %q both receive tracked topic %q, which declares no consumers; %q runs untracked so that it skips nothing. "+
		"Declare them: Tracked{Topic: %q, Consumers: []string{%q, %q}}", other, consumer, t.name, consumer, t.name, other, consumer))
}

func (m *middleware) reportOnce(t *tracked, consumer, other, text string) {
	if _, done := t.conflicts.LoadOrStore(consumer+"\x00"+other, struct{}{}); done {
		return
	}
	m.logger.Error("Tracked topic received by an undeclared consumer", errors.New(text),
		watermill.LogFields{"topic": t.name, "consumer": consumer, "other_consumer": other})
}

// settle runs the handler of an admitted message and completes, counts or
// releases its delivery according to the outcome.
func (m *middleware) settle(h message.HandlerFunc, msg *message.Message, a *admission) ([]*message.Message, error) {
	ctx := msg.Context()
	for _, k := range outboxKeys {
		delete(msg.Metadata, k)
	}
	identity := a.t.identityText(ctx)
	d := &delivery{ref: RecordRef{Topic: a.t.name, ID: a.d.ID, Consumer: a.d.Consumer}, d: a.d, store: a.t.store}
	msg.SetContext(context.WithValue(ctx, recordKey{}, d))

	produced, herr, panicked := runHandler(h, msg)
	msg.SetContext(ctx)
	if panicked != nil {
		// The panic counts as a failed attempt whichever side of the
		// outbox middleware a Recoverer sits; unless the record was
		// abandoned, it goes on up as it came.
		ferr := m.failed(ctx, msg, a, d, fmt.Errorf("handler panicked: %v", panicked), identity)
		if IsAbandoned(ferr) {
			return nil, ferr
		}
		panic(panicked)
	}
	if herr != nil && !IsDrop(herr) {
		return produced, m.failed(ctx, msg, a, d, herr, identity)
	}
	if d.completed.Load() {
		// The handler's transaction completed the record (CompleteTx).
		return produced, nil
	}
	if herr != nil {
		m.logger.Info("Handler dropped message, completing its record", a.fields.Add(watermill.LogFields{"reason": herr.Error()}))
		produced = nil
	}
	if len(produced) > 0 {
		// The router publishes what the handler produced after this returns
		// and nacks if that fails. Completing now would turn the redelivery
		// into a skipped duplicate and lose the produced messages, so the
		// record is completed only once the router acks.
		go m.completeOnAck(ctx, msg, a)
		return produced, nil
	}
	m.complete(ctx, a)
	return nil, nil
}

// runHandler runs h and returns what it panicked with, if it did.
func runHandler(h message.HandlerFunc, msg *message.Message) (produced []*message.Message, err error, panicked any) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	produced, err = h(msg)
	return produced, err, nil
}

// failed settles a handler failure: counts it, abandons after the last
// allowed attempt, or puts the outbox keys back and releases the lease.
func (m *middleware) failed(ctx context.Context, msg *message.Message, a *admission, d *delivery, herr error, identity string) error {
	m.reg.observer().Failed(a.t.name, a.d.Consumer)
	if aerr := m.recordFailure(ctx, a, herr); aerr != nil {
		// The record is no longer pending: the message leaves without
		// its outbox keys, so a poison queue that keeps it does not
		// carry a stale record id.
		if m.cfg.OnAbandon != nil {
			m.cfg.OnAbandon(msg, aerr)
		}
		return aerr
	}
	msg.Metadata[MetadataID] = a.idText
	msg.Metadata[MetadataTopic] = a.t.name
	msg.Metadata[MetadataStore] = identity
	if !d.completed.Load() {
		m.release(ctx, a)
	}
	return herr
}

// identityText is the identity the admission already read; reading it
// again hits the store's cache.
func (t *tracked) identityText(ctx context.Context) string {
	id, _ := t.store.Identity(ctx)
	return id
}

func (m *middleware) completeOnAck(ctx context.Context, msg *message.Message, a *admission) {
	select {
	case <-msg.Acked():
		m.complete(ctx, a)
	case <-msg.Nacked():
		m.logger.Debug("Publishing produced messages failed, record stays pending", a.fields)
	}
}

func (m *middleware) complete(ctx context.Context, a *admission) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompleteTimeout)
	defer cancel()
	err := a.t.store.Complete(ctx, a.d)
	switch {
	case err == nil:
		m.reg.observer().Handled(a.t.name, a.d.Consumer)
	case errors.Is(err, ErrNotPending):
		m.logger.Debug("Record was completed by another delivery", a.fields)
	default:
		m.logger.Error("Completing record failed; it stays pending for the next replay", err, a.fields)
	}
}

// release gives up the delivery lease of a record whose handler failed, so
// that the redelivery need not wait for the lease to run out. Only stores
// with a lease implement [recordstore.Releaser]; a failure is logged and the lease runs
// out on its own.
func (m *middleware) release(ctx context.Context, a *admission) {
	r, ok := a.t.store.(recordstore.Releaser)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompleteTimeout)
	defer cancel()
	if err := r.Release(ctx, a.d); err != nil {
		m.logger.Error("Releasing the lease of a failed delivery failed; it runs out on its own", err, a.fields)
	}
}

// hold waits d, or until the message is cancelled, before a nack, so that
// a broker that redelivers at once does not spin.
func (m *middleware) hold(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// recordFailure counts a failed handling on a store that keeps attempts and
// returns the [*AbandonedError] when it abandoned the delivery; nil
// otherwise. A store that cannot count leaves the record pending, as
// without it.
func (m *middleware) recordFailure(ctx context.Context, a *admission, herr error) *AbandonedError {
	fr, ok := a.t.store.(recordstore.FailureRecorder)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompleteTimeout)
	defer cancel()
	attempts, abandoned, err := fr.RecordFailure(ctx, a.d, herr.Error(), m.cfg.MaxAttempts, m.cfg.Backoff.Delay)
	switch {
	case errors.Is(err, ErrNotPending):
		return nil
	case err != nil:
		m.logger.Error("Counting the failed attempt failed; the record stays pending", err, a.fields)
		return nil
	case !abandoned:
		return nil
	}
	aerr := &AbandonedError{Topic: a.t.name, ID: a.d.ID, Attempts: attempts, Err: herr}
	m.reg.observer().Abandoned(a.t.name, a.d.Consumer)
	m.logger.Error("Record abandoned after its last allowed attempt", herr, a.fields.Add(watermill.LogFields{"attempts": attempts}))
	return aerr
}
