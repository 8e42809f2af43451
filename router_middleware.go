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
	// message is nacked, and the next copy confirms again. Use the
	// service's plain publisher, not one decorated by the outbox. Defaults
	// to nil: a message that asks for a confirmation is handled, and the
	// missing publisher is logged as an error once.
	Confirmations message.Publisher
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
	if c.CheckRetryDelay == 0 {
		c.CheckRetryDelay = 50 * time.Millisecond
	}
	if c.CheckRetryMaxDelay == 0 {
		c.CheckRetryMaxDelay = max(5*time.Second, c.CheckRetryDelay)
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
	if c.CheckRetryDelay < 0 || c.CheckRetryMaxDelay < c.CheckRetryDelay {
		return fmt.Errorf("%w: CheckRetryDelay %v must not be negative nor above CheckRetryMaxDelay %v", ErrInvalidConfig, c.CheckRetryDelay, c.CheckRetryMaxDelay)
	}
	if c.MaxAttempts < 0 {
		return fmt.Errorf("%w: MaxAttempts %d is negative", ErrInvalidConfig, c.MaxAttempts)
	}
	if c.BusinessKey != nil && c.Inbox == nil {
		return fmt.Errorf("%w: BusinessKey needs an Inbox to deduplicate in", ErrInvalidConfig)
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
//   - the record was saved for another message (the message's UUID is not
//     the record's: a forged or corrupted message naming it): acknowledges
//     without running the handler, touching no record, logs an error and
//     reports [Observer.Mismatched];
//   - the check failed: returns a [*FetchError] (nack) without running the
//     handler, after holding the message for
//     [MiddlewareConfig.CheckRetryDelay], doubled with each consecutive
//     failed check;
//   - the record's next attempt is not due yet ([MiddlewareConfig.Backoff]):
//     holds the message until it is due, or until its context ends, then
//     nacks it itself (msg.Nack) and returns nil, without running the
//     handler: a hold is routine, so the router logs no error for it, and a
//     Retry or PoisonQueue outside does not take it for a failure;
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
// # Produced messages
//
// A handler that returns messages succeeds only once the router has
// published them: the delivery is completed when the router acks it. A
// failed publish (the router nacks) is a failed attempt, as a handler error
// is: it is counted, with the backoff and MaxAttempts, and an abandonment
// after it is logged and reported to OnAbandon, since the middleware has
// returned. With [PublisherDecorator] on the router, each produced message
// to a tracked topic is saved with a key of the delivery and its position
// ([recordstore.Record.Origin]), so that a rerun of the handler saves no
// second record and sends the first run's saved message again (its UUID,
// payload and metadata) rather than the rerun's; the decorator counts its
// failure before the router nacks, so the copy the broker redelivers at
// once is held by the backoff. A publish the decorator does not see (an
// untracked topic, a publisher without it) is counted after the nack,
// racing the redelivery; a store with a delivery lease closes that race.
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
// the check has a deadline ([MiddlewareConfig.FetchTimeout]), and a check
// that fails (a database that refuses connections) holds its message for a
// growing delay before the nack ([MiddlewareConfig.CheckRetryDelay]).
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
	if cfg.Confirmations != nil {
		cfg.Confirmations = undecorated(cfg.Confirmations)
	}
	m := &middleware{reg: reg, cfg: cfg, logger: logger, leasePrefix: newLeasePrefix(),
		checks: failedChecks{delay: cfg.CheckRetryDelay, max: cfg.CheckRetryMaxDelay},
		inbox:  failedChecks{delay: cfg.CheckRetryDelay, max: cfg.CheckRetryMaxDelay}}
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
	checks, inbox failedChecks
	// unconfirmed logs, once per consumer, a message that asks for a
	// confirmation this middleware cannot publish.
	unconfirmed sync.Map
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
	foreign                  // another service's tracked message: its receiver side (inbox, confirmation)
)

func (m *middleware) handleTracked(h message.HandlerFunc, msg *message.Message, idText string) ([]*message.Message, error) {
	a, v, err := m.admit(msg, idText)
	switch v {
	case untracked:
		if m.cfg.OnUntracked != nil {
			m.cfg.OnUntracked(msg)
		}
		return h(msg)
	case skip:
		return nil, nil
	case refuse:
		if errors.Is(err, recordstore.ErrNotDue) {
			// A hold is routine: the middleware nacks the copy itself and
			// returns nil, so that the router, which logs every handler
			// error at Error, logs nothing (its Ack after a Nack is a
			// no-op), and a Retry or PoisonQueue outside does not take the
			// hold for a failure.
			msg.Nack()
			return nil, nil
		}
		return nil, err
	case foreign:
		return m.receive(h, msg)
	}
	return m.settle(h, msg, a)
}
