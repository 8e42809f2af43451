package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/internal/checkretry"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/recordstore"
)

// MiddlewareConfig configures [NewMiddleware].
type MiddlewareConfig struct {
	// CheckTimeout bounds the check before the handler (reading, or
	// claiming, the record). When it runs out the middleware returns a
	// [*CheckError] (nack) without running the handler, so that a database
	// that accepts connections but never answers cannot hold a delivery.
	// Defaults to 10 seconds.
	CheckTimeout time.Duration
	// CompleteTimeout bounds the mark (or delete) after the handler. It runs
	// on a context that keeps the message context's values but not its
	// cancellation, so that a router shutting down still completes the
	// records of handlers that finished. Defaults to 10 seconds.
	CompleteTimeout time.Duration
	// CompleteBeforeAck completes each delivery on the handler's path,
	// before the message is acknowledged. Defaults to false: the message
	// goes as soon as its handler succeeds, and its completion follows off
	// the handler's path, gathered with the completions of the deliveries
	// that finish meanwhile into one statement (for CompleteBatchWait), so
	// that the next message need not wait for a commit and a busy store
	// commits once for many messages. The price of the default: a crash
	// (or a failed completion, which is logged) between the
	// acknowledgement and the completion's commit leaves the record
	// pending, so that it is sent again and handled twice, never lost.
	// [Registry.WaitCompletions] waits for the completions in the
	// background, for a clean stop. A topic with an [Tracked.OrderKey],
	// whose next record waits for the completion, a handler that produced
	// messages (completed on the router's acknowledgement) and
	// [CompleteTx] complete on the handler's path whatever this says, and
	// so does a delivery beyond 4096 completions in the background.
	CompleteBeforeAck bool
	// CompleteBatchWait is how long a completion in the background waits
	// for others to go with it: the first one to finish starts the wait,
	// and every completion that arrives meanwhile goes in the same
	// statement, so that even one message at a time commits once per
	// CompleteBatchWait rather than once per message. It is also how much
	// longer a crash may leave records pending. A negative value sends
	// each at once. Defaults to 5 milliseconds.
	CompleteBatchWait time.Duration
	// CheckFirstCopies checks the record before the handler runs for every
	// copy. Defaults to false: the first copy, per local consumer, of a
	// record this process published (among its last 16,384 of the topic)
	// runs without the check, since the publish has just saved the record,
	// pending, due and the message's own; every later copy, and every copy
	// of a record published elsewhere, is checked. The price of the
	// default: a copy of the record sent again elsewhere (a replay at
	// another instance's start) and completed there before the first copy
	// arrives here runs again, as two copies checked at the same moment
	// do; and where several instances take turns on one queue, a copy
	// another instance handled and failed may come back here as this
	// process's first copy and run before its backoff is due (MaxAttempts
	// still counts it). A topic with an [Tracked.OrderKey] (the check
	// tells whether the record is held) and a store with a delivery lease
	// (the check takes it) check every copy whatever this says.
	CheckFirstCopies bool
	// CheckRetryDelay is how long the middleware holds a message whose
	// check failed (the database refused the connection, or gave an error)
	// before it nacks it; each further consecutive failed check of the
	// middleware, whichever message it was for, doubles the delay up to
	// CheckRetryMaxDelay, and the first check that the database answers
	// resets it. A refused connection fails in microseconds: without the
	// hold, a broker that redelivers at once would make every message in
	// flight spin against the database and the router's error log. So,
	// while the database is unreachable, each message in flight is checked,
	// and its nack logged, at most once per CheckRetryDelay (20 times a
	// second with the default), and after the first failures at most once
	// per CheckRetryMaxDelay. The inbox check of other services' messages
	// ([MiddlewareConfig.Inbox]) is spaced the same way, with a count of its
	// own. Defaults to 50 milliseconds.
	CheckRetryDelay time.Duration
	// CheckRetryMaxDelay caps the delay of CheckRetryDelay. Defaults to 5
	// seconds.
	CheckRetryMaxDelay time.Duration

	// LeasedNackDelay is how long the middleware holds a copy whose record
	// another delivery has leased (a store with a delivery lease, see
	// [recordstore.Releaser]) before it nacks it, so that a broker that redelivers at
	// once (GoChannel, an AMQP requeue) does not spin against the database
	// while the first delivery runs. Defaults to 50 milliseconds.
	LeasedNackDelay time.Duration
	// HeldWait is how long a copy of a topic with an ordering key
	// ([Tracked.OrderKey]) that an earlier record of its key holds waits
	// for that record to complete in this process. A checked copy waits in
	// the handler, checked again each time, and is then put back:
	// acknowledged without running the handler, its record left pending,
	// and sent again once the earlier record completes, or by the stale
	// resubmitter or the next replay. A first copy whose earlier record has
	// yet to arrive here waits off the handler's path, and a message the
	// publisher holds for its earlier record (once the broker was seen to
	// reorder) waits in the publisher; either is sent again after
	// HeldWait. Without a replay or stale resubmitter built on the
	// registry, whose publisher sends it, the copy is nacked instead.
	// Defaults to 250 milliseconds.
	HeldWait time.Duration
	// HeldResendAfter is how old the last send of the earlier record that
	// holds a copy must be for the held copy to have it sent again at once
	// (its copy may be lost), through the store's stale claim, so that it
	// is sent at most once per HeldResendAfter whatever the number of held
	// copies and instances. Defaults to 2 seconds.
	HeldResendAfter time.Duration

	// MaxAttempts abandons a record after this many failed handlings, on a
	// store that implements [recordstore.FailureRecorder]: the record is kept, no longer
	// pending, and the middleware returns an [*AbandonedError]. Each failure
	// is counted, with its error text, whatever MaxAttempts is; a
	// successful handling costs nothing extra. The failures that remote
	// consumers report ([Tracked.RemoteConsumers]) count the same way, with
	// the MaxAttempts and Backoff of the first middleware built on the
	// registry. Defaults to 0, which never abandons.
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
	// returns; for example to publish the message somewhere else. When the
	// last attempt failed publishing what the handler produced, the
	// middleware has returned already: OnAbandon is called from the
	// router's publish (or after its nack), and a PoisonQueue outside the
	// middleware sees nothing. Defaults to nil.
	OnAbandon func(msg *message.Message, err *AbandonedError)

	// OnUntracked, when set, is called with each message of a tracked
	// topic of this service's table that the middleware lets through to
	// its handler untracked, touching no record: a handler that is not a
	// declared consumer of the topic, a second handler of a topic that
	// declares none, malformed outbox metadata, a topic completed on
	// send. The record stays pending for its consumers. The outbox logs
	// the cause (once per handler at Error); outboxtest.Deliver uses it to
	// fail the test. Defaults to nil.
	OnUntracked func(msg *message.Message)

	// Inbox, when set, deduplicates the tracked messages of other services
	// (messages whose records live in another service's table) per
	// consumer: a copy that the consumer has already handled is
	// acknowledged without running the handler, and a handled one is
	// recorded once its handler has succeeded (or dropped it), or in the
	// handler's own transaction with [InboxTx]. Two copies handled at the
	// same moment (the router runs messages concurrently) may both run the
	// handler unless it records the message with InboxTx first, which
	// makes the second wait and then skip. The sqlstore package's NewInbox
	// and the outboxtest package's NewInbox provide one. Defaults to nil:
	// other services' messages run the handler on every copy.
	Inbox recordstore.Inbox
	// BusinessKey, when set with Inbox, names the operation a message of
	// another service asks for (an order number, say): a message with
	// another UUID and the same non-empty key is a duplicate for the
	// consumer. Defaults to nil: only copies of one message are
	// duplicates.
	BusinessKey func(msg *message.Message) string
	// Confirmations is the publisher that confirms the deliveries of other
	// services' messages that ask for it ([MetadataConfirmTo]: their topic
	// declares this handler in [Tracked.RemoteConsumers]): once the
	// handler has succeeded, or dropped the message, the middleware
	// publishes a confirmation to the topic the message names, and the
	// sending service completes the delivery. If that publish fails the
	// message is nacked, and the next copy confirms again. When the
	// handler fails (or panics, or its [InboxTx] transaction did not
	// commit), the failure is reported the same way and the message is
	// acknowledged: the sender counts it toward its MaxAttempts and sends
	// the message again after its confirmation window
	// ([StaleResubmitterConfig.ConfirmWithin]). Use the service's plain
	// publisher, not one decorated by the outbox. Defaults to nil: a
	// message that asks for a confirmation is handled (a failure nacked),
	// and the missing publisher is logged as an error once.
	Confirmations message.Publisher
}

func (c *MiddlewareConfig) setDefaults() {
	if c.CheckTimeout == 0 {
		c.CheckTimeout = 10 * time.Second
	}
	if c.CompleteTimeout == 0 {
		c.CompleteTimeout = 10 * time.Second
	}
	if c.CompleteBatchWait == 0 {
		c.CompleteBatchWait = 5 * time.Millisecond
	}
	if c.LeasedNackDelay == 0 {
		c.LeasedNackDelay = 50 * time.Millisecond
	}
	if c.CheckRetryDelay == 0 {
		c.CheckRetryDelay = 50 * time.Millisecond
	}
	if c.HeldWait == 0 {
		c.HeldWait = 250 * time.Millisecond
	}
	if c.HeldResendAfter == 0 {
		c.HeldResendAfter = 2 * time.Second
	}
	if c.CheckRetryMaxDelay == 0 {
		c.CheckRetryMaxDelay = max(5*time.Second, c.CheckRetryDelay)
	}
	c.Backoff.setDefaults()
}

// Validate reports a configuration error, if any.
func (c MiddlewareConfig) Validate() error {
	if c.CheckTimeout < 0 {
		return fmt.Errorf("%w: CheckTimeout %v is negative", ErrInvalidConfig, c.CheckTimeout)
	}
	if c.CompleteTimeout < 0 {
		return fmt.Errorf("%w: CompleteTimeout %v is negative", ErrInvalidConfig, c.CompleteTimeout)
	}
	if c.LeasedNackDelay < 0 {
		return fmt.Errorf("%w: LeasedNackDelay %v is negative", ErrInvalidConfig, c.LeasedNackDelay)
	}
	if c.CheckRetryDelay < 0 || c.CheckRetryMaxDelay < c.CheckRetryDelay {
		return fmt.Errorf("%w: CheckRetryDelay %v must not be negative nor above CheckRetryMaxDelay %v", ErrInvalidConfig, c.CheckRetryDelay, c.CheckRetryMaxDelay)
	}
	if c.HeldWait < 0 || c.HeldResendAfter < 0 {
		return fmt.Errorf("%w: HeldWait %v and HeldResendAfter %v must not be negative", ErrInvalidConfig, c.HeldWait, c.HeldResendAfter)
	}
	if c.MaxAttempts < 0 {
		return fmt.Errorf("%w: MaxAttempts %d is negative", ErrInvalidConfig, c.MaxAttempts)
	}
	if c.BusinessKey != nil && c.Inbox == nil {
		return fmt.Errorf("%w: BusinessKey needs an Inbox to deduplicate in", ErrInvalidConfig)
	}
	return c.Backoff.Validate()
}

// NewMiddleware returns the router middleware that checks the record of
// each tracked message before the handler ([CheckOutcome] lists what the
// check decides) and completes the consumer's delivery once the handler
// succeeded or returned a [Drop] error (step 2 of [How it works]); any
// other error leaves the delivery pending, due again after
// [MiddlewareConfig.Backoff]. Messages that are not this service's run the
// handler untracked. While the handler runs the outbox keys are removed from
// the metadata and the record is available from [RecordFromContext]. Add it
// outside Retry ([Middleware order]). Failures are bounded as
// [Bounded delivery] says; other services' messages are received as
// [Receivers in other services] says. A nil logger logs nothing.
//
// [How it works]: https://pkg.go.dev/github.com/wmoutbox/outbox#hdr-How_it_works
// [Middleware order]: https://pkg.go.dev/github.com/wmoutbox/outbox#hdr-Middleware_order
// [Bounded delivery]: https://pkg.go.dev/github.com/wmoutbox/outbox#hdr-Bounded_delivery
// [Receivers in other services]: https://pkg.go.dev/github.com/wmoutbox/outbox#hdr-Receivers_in_other_services
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
	if cfg.Confirmations != nil {
		cfg.Confirmations = undecorated(cfg.Confirmations)
	}
	reg.failurePolicy.CompareAndSwap(nil, &failurePolicy{maxAttempts: cfg.MaxAttempts, backoff: cfg.Backoff})
	reg.heldWait.CompareAndSwap(0, int64(cfg.HeldWait))
	if !cfg.CheckFirstCopies {
		for _, t := range reg.entries() {
			t.firstCopies.On.Store(true)
		}
	}
	m := &middleware{reg: reg, cfg: cfg, logger: logger, leasePrefix: newLeasePrefix(),
		checks: checkretry.Spacer{Delay: cfg.CheckRetryDelay, Max: cfg.CheckRetryMaxDelay},
		inbox:  checkretry.Spacer{Delay: cfg.CheckRetryDelay, Max: cfg.CheckRetryMaxDelay}}
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
	// checks and inbox space the record checks and the inbox checks while
	// they fail.
	checks, inbox checkretry.Spacer
	// unconfirmed logs, once per consumer, a message that asks for a
	// confirmation this middleware cannot publish.
	unconfirmed sync.Map
	// receiver is the identity the confirmations name, once read.
	receiver atomic.Pointer[string]
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

// checkForeign is admission's outcome for another service's tracked
// message: its receiver side (inbox, confirmation) handles it.
const checkForeign observe.CheckOutcome = "foreign"

func (m *middleware) handleTracked(h message.HandlerFunc, msg *message.Message, idText string) ([]*message.Message, error) {
	a, o, err := m.admit(msg, idText)
	if o == observe.CheckRefused {
		var here *heldHere
		var held *recordstore.HeldError
		switch {
		case errors.As(err, &here):
			return m.park(msg, a, here.before)
		case errors.As(err, &held):
			return m.onHeld(h, msg, idText, a, held)
		}
	}
	return m.after(h, msg, a, o, err)
}

// after acts on admission's outcome.
func (m *middleware) after(h message.HandlerFunc, msg *message.Message, a *admission, o observe.CheckOutcome, err error) ([]*message.Message, error) {
	switch o {
	case observe.CheckPending:
		return m.run(h, msg, a)
	case observe.CheckUntracked:
		if m.cfg.OnUntracked != nil {
			m.cfg.OnUntracked(msg)
		}
		return h(msg)
	case observe.CheckDuplicate, observe.CheckUnknown, observe.CheckMismatch:
		return nil, nil
	case checkForeign:
		return m.receive(h, msg)
	default: // observe.CheckRefused
		if errors.Is(err, recordstore.ErrNotDue) || errors.Is(err, recordstore.ErrHeld) {
			// A hold is routine: the middleware nacks the copy itself and
			// returns nil, so that the router, which logs every handler
			// error at Error, logs nothing (its Ack after a Nack is a
			// no-op), and a Retry or PoisonQueue outside does not take the
			// hold for a failure.
			msg.Nack()
			return nil, nil
		}
		return nil, err
	}
}
