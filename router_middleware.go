package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// MiddlewareConfig configures [NewMiddleware].
type MiddlewareConfig struct {
	// CompleteTimeout bounds the mark (or delete) after the handler. It runs
	// on a context that keeps the message context's values but not its
	// cancellation, so that a router shutting down still completes the
	// records of handlers that finished. Defaults to 10 seconds.
	CompleteTimeout time.Duration

	// LeasedNackDelay is how long the middleware holds a copy whose record
	// another delivery has leased (a store with a delivery lease, see
	// [Releaser]) before it nacks it, so that a broker that redelivers at
	// once (GoChannel, an AMQP requeue) does not spin against the database
	// while the first delivery runs. Defaults to 50 milliseconds.
	LeasedNackDelay time.Duration
	// MaxAttempts abandons a record after this many failed handlings, on a
	// store that implements [FailureRecorder]: the record is kept, no longer
	// pending, and the middleware returns an [*AbandonedError]. Each failure
	// is counted, with its error text, whatever MaxAttempts is; a
	// successful handling costs nothing extra. Defaults to 0, which never
	// abandons.
	MaxAttempts int
	// OnAbandon, when set, is called with the message and the
	// [*AbandonedError] after a record is abandoned, before the middleware
	// returns; for example to publish the message somewhere else. Defaults
	// to nil.
	OnAbandon func(msg *message.Message, err *AbandonedError)
}

func (c *MiddlewareConfig) setDefaults() {
	if c.CompleteTimeout == 0 {
		c.CompleteTimeout = 10 * time.Second
	}
	if c.LeasedNackDelay == 0 {
		c.LeasedNackDelay = 50 * time.Millisecond
	}
}

// Validate reports a configuration error, if any.
func (c MiddlewareConfig) Validate() error {
	if c.CompleteTimeout < 0 {
		return fmt.Errorf("%w: CompleteTimeout %v is negative", ErrInvalidConfig, c.CompleteTimeout)
	}
	if c.LeasedNackDelay < 0 {
		return fmt.Errorf("%w: LeasedNackDelay %v is negative", ErrInvalidConfig, c.LeasedNackDelay)
	}
	if c.MaxAttempts < 0 {
		return fmt.Errorf("%w: MaxAttempts %d is negative", ErrInvalidConfig, c.MaxAttempts)
	}
	return nil
}

// NewMiddleware returns the router middleware that completes the records of
// tracked messages. Add it before (outside of) Retry, and of a PoisonQueue
// that diverts dropped messages; a PoisonQueue that diverts abandoned ones
// ([IsAbandoned]) goes outside it.
//
// A message without [MetadataID] runs the handler untouched. For a tracked
// message the middleware:
//
//   - checks that the record is pending, on a connection it gives back before
//     the handler runs;
//   - not pending (completed, deleted, never existed): acknowledges without
//     running the handler;
//   - the check failed: returns a [*FetchError] (nack) without running the
//     handler;
//   - leased by another delivery (a store with a delivery lease): returns a
//     [*LeasedError] (nack) after LeasedNackDelay, without running the
//     handler;
//   - runs the handler, then completes the record when the handler succeeded
//     or returned a [Drop] error (which is acknowledged), or leaves it pending
//     and returns the handler's error (nack), releasing its lease;
//   - skips its own completion when the handler completed the record in its
//     transaction ([CompleteTx]);
//   - on a store that implements [FailureRecorder], counts each failure with
//     its error text and, after [MiddlewareConfig.MaxAttempts] failures,
//     abandons the record and returns an [*AbandonedError] instead.
//
// A failed completion is logged; the handler's outcome stands and the record
// stays pending for the next replay. A malformed [MetadataID] returns an error
// wrapping [ErrInvalidMetadata] without running the handler. A message whose
// [MetadataName] is not tracked here runs the handler untracked and is
// logged, since no store of this service holds its record.
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
	m := &middleware{reg: reg, cfg: cfg, logger: logger}
	return m.wrap, nil
}

type middleware struct {
	reg    *Registry
	cfg    MiddlewareConfig
	logger watermill.LoggerAdapter
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

func (m *middleware) handleTracked(h message.HandlerFunc, msg *message.Message, idText string) ([]*message.Message, error) {
	name := msg.Metadata[MetadataName]
	store := m.reg.byName[name]
	if store == nil {
		m.logger.Error("Tracked message of a name this service does not track; handling it untracked", nil, watermill.LogFields{
			"message_uuid": msg.UUID, "outbox_name": truncate(name, 128), "outbox_id": truncate(idText, 64),
		})
		return h(msg)
	}
	id, err := parseID(idText)
	if err != nil {
		return nil, fmt.Errorf("message %s of %q: %w", msg.UUID, name, err)
	}
	fields := watermill.LogFields{"message_uuid": msg.UUID, "outbox_name": name, "outbox_id": id}

	ctx := msg.Context()
	switch err := store.CheckPending(ctx, id); {
	case errors.Is(err, ErrNotPending):
		m.logger.Debug("Record already completed, acking copy without handling", fields)
		if o := m.reg.observer(); o != nil {
			o.DuplicateSkipped(name)
		}
		return nil, nil
	case errors.Is(err, ErrLeased):
		m.logger.Debug("Record leased by another delivery, nacking copy without handling", fields)
		m.holdLeased(ctx)
		return nil, &LeasedError{Name: name, ID: id, Err: err}
	case err != nil:
		return nil, &FetchError{Name: name, ID: id, Err: err}
	}

	delete(msg.Metadata, MetadataID)
	delete(msg.Metadata, MetadataName)
	d := &delivery{ref: RecordRef{Name: name, ID: id}, store: store}
	msg.SetContext(context.WithValue(ctx, recordKey{}, d))

	produced, herr := h(msg)
	if herr != nil && !IsDrop(herr) {
		if o := m.reg.observer(); o != nil {
			o.Failed(name)
		}
		if aerr := m.recordFailure(ctx, store, name, id, herr, fields); aerr != nil {
			// The record is no longer pending: the message leaves without
			// its outbox keys, so a poison queue that keeps it does not
			// carry a stale record id.
			msg.SetContext(ctx)
			if m.cfg.OnAbandon != nil {
				m.cfg.OnAbandon(msg, aerr)
			}
			return produced, aerr
		}
		msg.Metadata[MetadataID] = idText
		msg.Metadata[MetadataName] = name
		msg.SetContext(ctx)
		if !d.completed.Load() {
			m.release(ctx, store, id, fields)
		}
		return produced, herr
	}
	if d.completed.Load() {
		// The handler's transaction completed the record (CompleteTx).
		return produced, nil
	}
	if herr != nil {
		m.logger.Info("Handler dropped message, completing its record", fields.Add(watermill.LogFields{"reason": herr.Error()}))
		produced = nil
	}
	if len(produced) > 0 {
		// The router publishes what the handler produced after this returns
		// and nacks if that fails. Completing now would turn the redelivery
		// into a skipped duplicate and lose the produced messages, so the
		// record is completed only once the router acks.
		go m.completeOnAck(ctx, msg, store, name, id, fields)
		return produced, nil
	}
	m.complete(ctx, store, name, id, fields)
	return nil, nil
}

func (m *middleware) completeOnAck(ctx context.Context, msg *message.Message, store Store, name string, id int64, fields watermill.LogFields) {
	select {
	case <-msg.Acked():
		m.complete(ctx, store, name, id, fields)
	case <-msg.Nacked():
		m.logger.Debug("Publishing produced messages failed, record stays pending", fields)
	}
}

func (m *middleware) complete(ctx context.Context, store Store, name string, id int64, fields watermill.LogFields) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompleteTimeout)
	defer cancel()
	err := store.Complete(ctx, id)
	switch {
	case err == nil:
		if o := m.reg.observer(); o != nil {
			o.Handled(name)
		}
	case errors.Is(err, ErrNotPending):
		m.logger.Debug("Record was completed by another delivery", fields)
	default:
		m.logger.Error("Completing record failed; it stays pending for the next replay", err, fields)
	}
}

// release gives up the delivery lease of a record whose handler failed, so
// that the redelivery need not wait for the lease to run out. Only stores
// with a lease implement [Releaser]; a failure is logged and the lease runs
// out on its own.
func (m *middleware) release(ctx context.Context, store Store, id int64, fields watermill.LogFields) {
	r, ok := store.(Releaser)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompleteTimeout)
	defer cancel()
	if err := r.Release(ctx, id); err != nil {
		m.logger.Error("Releasing the lease of a failed delivery failed; it runs out on its own", err, fields)
	}
}

// holdLeased waits LeasedNackDelay, or until the message is cancelled.
func (m *middleware) holdLeased(ctx context.Context) {
	t := time.NewTimer(m.cfg.LeasedNackDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// recordFailure counts a failed handling on a store that keeps attempts and
// returns the [*AbandonedError] when it abandoned the record; nil otherwise.
// A store that cannot count leaves the record pending, as without it.
func (m *middleware) recordFailure(ctx context.Context, store Store, name string, id int64, herr error, fields watermill.LogFields) *AbandonedError {
	fr, ok := store.(FailureRecorder)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompleteTimeout)
	defer cancel()
	attempts, abandoned, err := fr.RecordFailure(ctx, id, herr.Error(), m.cfg.MaxAttempts)
	switch {
	case errors.Is(err, ErrNotPending):
		return nil
	case err != nil:
		m.logger.Error("Counting the failed attempt failed; the record stays pending", err, fields)
		return nil
	case !abandoned:
		return nil
	}
	aerr := &AbandonedError{Name: name, ID: id, Attempts: attempts, Err: herr}
	if o := m.reg.observer(); o != nil {
		o.Abandoned(name)
	}
	m.logger.Error("Record abandoned after its last allowed attempt", herr, fields.Add(watermill.LogFields{"attempts": attempts}))
	return aerr
}
