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

// MiddlewareConfig configures [NewMiddleware]. Every field has a default;
// docs/operations.md says when to change one.
type MiddlewareConfig struct {
	// Check configures the check of a record before its handler runs.
	Check CheckConfig
	// Complete configures the completion after the handler.
	Complete CompleteConfig

	// MaxAttempts abandons a record after this many failed handlings
	// (local or remote): kept, no longer pending, with an
	// [*AbandonedError]. Defaults to 0, which never abandons.
	MaxAttempts int
	// Backoff spaces the attempts of a failing delivery, in the database:
	// a copy that arrives earlier is held until then and nacked unrun.
	// Defaults to [Backoff]'s defaults.
	Backoff Backoff
	// OnAbandon, when set, is called when a record is abandoned. Defaults
	// to nil.
	OnAbandon func(msg *message.Message, err *AbandonedError)
	// OnUntracked, when set, is called with each message of this service's
	// table that runs untracked (an undeclared handler, malformed
	// metadata). Defaults to nil.
	OnUntracked func(msg *message.Message)

	// Inbox, when set, deduplicates other services' tracked messages per
	// consumer (sqlstore.NewInbox, outboxtest.NewInbox); see [InboxTx].
	// Defaults to nil: every copy runs.
	Inbox recordstore.Inbox
	// BusinessKey, with Inbox, names the operation a message asks for:
	// another message with the same key is a duplicate. Defaults to nil.
	BusinessKey func(msg *message.Message) string
	// Confirmations is the plain (undecorated) publisher that confirms the
	// deliveries of other services' messages that ask for it
	// ([Tracked.RemoteConsumers]), and reports their failures. Defaults to
	// nil: such a message is handled unconfirmed, logged once.
	Confirmations message.Publisher
}

// CheckConfig configures the check before the handler
// ([MiddlewareConfig.Check]).
type CheckConfig struct {
	// Timeout bounds the check, which then fails with a [*CheckError].
	// Defaults to 10 seconds.
	Timeout time.Duration
	// FirstCopies checks every copy, also the first copy of a record this
	// process has just published, which by default runs unchecked.
	// Defaults to false.
	FirstCopies bool
	// RetryDelay is how long a message whose check failed (the database
	// refused, or erred) is held before its nack, doubling with each
	// consecutive failure up to RetryMaxDelay. Defaults to 50 ms and 5 s.
	RetryDelay    time.Duration
	RetryMaxDelay time.Duration
	// LeasedNackDelay is how long a copy of a record another delivery has
	// leased ([recordstore.Releaser]) is held before its nack. Defaults to
	// 50 milliseconds.
	LeasedNackDelay time.Duration
	// HeldWait is how long a copy held by an earlier record of its key
	// ([Tracked.OrderKey]) waits for it to complete here before it is put
	// back. A message that waits in this process for an earlier record
	// still queued at the broker behind other copies, which keep coming,
	// waits for it longer, up to 40 times HeldWait. Defaults to 250
	// milliseconds.
	HeldWait time.Duration
	// HeldResendAfter is how old the last send of the record that holds a
	// copy must be for the held copy to have it sent again (its copy may
	// be lost). Defaults to 2 seconds.
	HeldResendAfter time.Duration
}

// CompleteConfig configures the completion after the handler
// ([MiddlewareConfig.Complete]).
type CompleteConfig struct {
	// Timeout bounds the completion, on a context that keeps the message
	// context's values but not its cancellation. Defaults to 10 seconds.
	Timeout time.Duration
	// BeforeAck completes each delivery before the message is
	// acknowledged. By default the completion follows the acknowledgement,
	// off the handler's path and combined with others, and a crash in
	// between makes the handler run again. Defaults to false.
	BeforeAck bool
	// BatchWait is how long a completion in the background waits for
	// others to go in the same statement, which sends at most 1024; negative
	// sends each at once. A crash loses the completions that wait, and
	// their handlers run again. Defaults to 50 milliseconds;
	// docs/benchmarks.md measures what a shorter wait costs.
	BatchWait time.Duration
}

func (c *MiddlewareConfig) setDefaults() {
	if c.Check.Timeout == 0 {
		c.Check.Timeout = 10 * time.Second
	}
	if c.Complete.Timeout == 0 {
		c.Complete.Timeout = 10 * time.Second
	}
	if c.Complete.BatchWait == 0 {
		c.Complete.BatchWait = defaultBatchWait
	}
	if c.Check.LeasedNackDelay == 0 {
		c.Check.LeasedNackDelay = 50 * time.Millisecond
	}
	if c.Check.RetryDelay == 0 {
		c.Check.RetryDelay = 50 * time.Millisecond
	}
	if c.Check.HeldWait == 0 {
		c.Check.HeldWait = defaultHeldWait
	}
	if c.Check.HeldResendAfter == 0 {
		c.Check.HeldResendAfter = 2 * time.Second
	}
	if c.Check.RetryMaxDelay == 0 {
		c.Check.RetryMaxDelay = max(5*time.Second, c.Check.RetryDelay)
	}
	c.Backoff.setDefaults()
}

// Validate reports a configuration error, if any.
func (c MiddlewareConfig) Validate() error {
	if c.Check.Timeout < 0 {
		return fmt.Errorf("%w: Check.Timeout %v is negative", ErrInvalidConfig, c.Check.Timeout)
	}
	if c.Complete.Timeout < 0 {
		return fmt.Errorf("%w: Complete.Timeout %v is negative", ErrInvalidConfig, c.Complete.Timeout)
	}
	if c.Check.LeasedNackDelay < 0 {
		return fmt.Errorf("%w: Check.LeasedNackDelay %v is negative", ErrInvalidConfig, c.Check.LeasedNackDelay)
	}
	if c.Check.RetryDelay < 0 || c.Check.RetryMaxDelay < c.Check.RetryDelay {
		return fmt.Errorf("%w: Check.RetryDelay %v must not be negative nor above Check.RetryMaxDelay %v", ErrInvalidConfig, c.Check.RetryDelay, c.Check.RetryMaxDelay)
	}
	if c.Check.HeldWait < 0 || c.Check.HeldResendAfter < 0 {
		return fmt.Errorf("%w: Check.HeldWait %v and Check.HeldResendAfter %v must not be negative", ErrInvalidConfig, c.Check.HeldWait, c.Check.HeldResendAfter)
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
// each tracked message before the handler and completes the consumer's
// delivery once the handler succeeded or returned a [Drop] error; any other
// error leaves it pending, due again after [MiddlewareConfig.Backoff].
// Other messages run the handler untracked. While the handler runs the
// record is available from [RecordFromContext]. Add it outside Retry
// ([Middleware order]). A nil logger logs nothing.
//
// [Middleware order]: https://pkg.go.dev/github.com/wmoutbox/outbox#hdr-Middleware_order
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
	reg.heldWait.CompareAndSwap(0, int64(cfg.Check.HeldWait))
	if !cfg.Check.FirstCopies {
		for _, t := range reg.entries() {
			t.firstCopies.On.Store(true)
		}
	}
	m := &middleware{reg: reg, cfg: cfg, logger: logger, leasePrefix: newLeasePrefix(),
		checks: checkretry.Spacer{Delay: cfg.Check.RetryDelay, Max: cfg.Check.RetryMaxDelay},
		inbox:  checkretry.Spacer{Delay: cfg.Check.RetryDelay, Max: cfg.Check.RetryMaxDelay}}
	return m.wrap, nil
}

// defaultHeldWait is Check.HeldWait's default.
const defaultHeldWait = 250 * time.Millisecond

// defaultBatchWait is Complete.BatchWait's default.
const defaultBatchWait = 50 * time.Millisecond

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
	// recent are the messages of ordered topics recorded in the inbox
	// lately, or running, here (remote_order.go).
	recent recentlyHandled
	// unordered logs, once per consumer, an ordered message that this
	// middleware keeps in no inbox.
	unordered sync.Map
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
	if o == observe.CheckRefused && a != nil && a.t.orderKey != "" {
		return m.refusedOrdered(h, msg, idText, a, err)
	}
	return m.after(h, msg, a, o, err)
}

// after acts on admission's outcome.
func (m *middleware) after(h message.HandlerFunc, msg *message.Message, a *admission, o observe.CheckOutcome, err error) ([]*message.Message, error) {
	switch o {
	case observe.CheckPending:
		if a.t.orderKey != "" {
			return m.runOrdered(h, msg, a)
		}
		return m.settle(h, msg, a)
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
