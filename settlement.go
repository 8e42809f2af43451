package outbox

// Settlement: what the handler's outcome does to the consumer's delivery
// (complete it, count a failure, release its lease, abandon it).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
)

// settle runs the handler of an admitted message and completes, counts or
// releases its delivery according to the outcome.
func (m *middleware) settle(h message.HandlerFunc, msg *message.Message, a *admission) ([]*message.Message, error) {
	ctx := msg.Context()
	for _, k := range outboxKeys {
		delete(msg.Metadata, k)
	}
	d := &delivery{d: a.d, store: a.t.store}
	msg.SetContext(context.WithValue(ctx, recordKey{}, d))

	produced, herr, panicked := runHandler(h, msg)
	msg.SetContext(ctx)
	if panicked != nil {
		// The panic counts as a failed attempt whichever side of the
		// outbox middleware a Recoverer sits; unless the record was
		// abandoned, it goes on up as it came.
		ferr := m.failed(ctx, msg, a, d, fmt.Errorf("handler panicked: %v", panicked))
		if IsAbandoned(ferr) {
			return nil, ferr
		}
		panic(panicked)
	}
	if herr != nil && !IsDrop(herr) {
		return produced, m.failed(ctx, msg, a, d, herr)
	}
	if d.completed.Load() {
		// The handler's transaction completed the record (CompleteTx).
		m.endOrdered(ctx, a, true)
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
		// record is completed only once the router acks; a failed publish
		// counts as a failed attempt.
		p := m.markProduced(ctx, msg, a, produced)
		m.reg.background.Spawn(func() { m.completeOnAck(ctx, msg, a, p) })
		return produced, nil
	}
	if !m.cfg.Complete.BeforeAck && (a.t.orderKey == "" || a.unchecked) {
		// A checked copy of an ordered topic completes on the handler's
		// path, as the copies held behind it wait for its completion; an
		// unchecked one goes at once, without a batch window, since the
		// next record of its key waits for it to commit.
		wait := m.cfg.Complete.BatchWait
		if a.t.orderKey != "" {
			wait = 0
		}
		if batch, ok := m.reg.background.StartCompletion(wait); ok {
			key := completingKey{id: a.d.ID, consumer: a.d.Consumer}
			c := &completion{done: make(chan struct{})}
			a.t.completing.Store(key, c)
			var w *windowed
			if _, ok := a.t.store.(recordstore.BatchCompleter); ok && wait > 0 {
				w = a.t.window.join(ctx, batch, a)
			}
			go func() {
				defer m.reg.background.DoneCompletion()
				<-batch
				if w != nil {
					c.ok = m.completeWindow(a.t, batch, w)
				} else {
					c.ok = m.complete(ctx, a)
				}
				a.t.completing.CompareAndDelete(key, c)
				close(c.done)
			}()
			return nil, nil
		}
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
func (m *middleware) failed(ctx context.Context, msg *message.Message, a *admission, d *delivery, herr error) error {
	if aerr := m.countFailure(ctx, msg, a, herr); aerr != nil {
		// Abandoned: with OrderSkipsAbandoned its key is free.
		m.endOrdered(ctx, a, a.t.skipAbandoned)
		// The record is no longer pending: the message leaves without
		// its outbox keys, so a poison queue that keeps it does not
		// carry a stale record id.
		return aerr
	}
	msg.Metadata[MetadataID] = a.idText
	msg.Metadata[MetadataTopic] = a.t.topic
	msg.Metadata[MetadataTable] = a.identity
	m.endOrdered(ctx, a, false)
	if !d.completed.Load() {
		m.release(ctx, a)
	}
	return herr
}

// countFailure counts a failed attempt of the delivery and, when that
// abandoned it, calls OnAbandon and returns the [*AbandonedError].
func (m *middleware) countFailure(ctx context.Context, msg *message.Message, a *admission, err error) *AbandonedError {
	m.reg.observer().Failed(a.t.topic, a.d.Consumer)
	aerr := m.recordFailure(ctx, a, err)
	if aerr != nil && m.cfg.OnAbandon != nil {
		m.cfg.OnAbandon(msg, aerr)
	}
	return aerr
}

// completeOnAck completes the delivery of a handler that produced messages
// once the router acks it. A nack means the router could not publish them
// (or a middleware outside this one failed): it counts as a failed attempt,
// unless the publisher decorator counted it already, before the nack, so
// that the copy the broker redelivers at once finds it counted.
func (m *middleware) completeOnAck(ctx context.Context, msg *message.Message, a *admission, p *production) {
	select {
	case <-msg.Acked():
		m.complete(ctx, a)
	case <-msg.Nacked():
		p.publishFailed(errNackedAfterSuccess)
		m.endOrdered(ctx, a, false)
	}
}

// complete completes the delivery, and reports whether its record is now
// complete (by this completion or another).
func (m *middleware) complete(ctx context.Context, a *admission) bool {
	var end func(error)
	if tr := m.reg.tracer(); tr != nil {
		ctx, end = tr.TraceComplete(ctx, RecordRef{Topic: a.t.topic, ID: a.d.ID, Consumer: a.d.Consumer})
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Complete.Timeout)
	defer cancel()
	err := a.t.store.Complete(ctx, a.d)
	return m.completed(ctx, a, err, end)
}

// completed ends the completion of the delivery with its outcome err, and
// reports whether its record is now complete.
func (m *middleware) completed(ctx context.Context, a *admission, err error, end func(error)) bool {
	endStep(end, err)
	defer m.endOrdered(ctx, a, err == nil || errors.Is(err, ErrNotPending))
	switch {
	case err == nil:
		m.reg.observer().Completed(a.t.topic, a.d.Consumer)
	case errors.Is(err, ErrNotPending):
		m.logger.Debug("Record was completed by another delivery", a.fields)
	default:
		m.logger.Error("Completing record failed; it stays pending for the next replay", err, a.fields)
		return false
	}
	return true
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
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Complete.Timeout)
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
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Complete.Timeout)
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
	aerr := &AbandonedError{Topic: a.t.topic, ID: a.d.ID, Attempts: attempts, Err: herr}
	m.reg.observer().Abandoned(a.t.topic, a.d.Consumer)
	m.logger.Error("Record abandoned after its last allowed attempt", herr, a.fields.Add(watermill.LogFields{"attempts": attempts}))
	return aerr
}

// endOrdered ends the run of an ordered delivery (ordering.go's settled):
// a delivery of a topic without a key has nothing to end.
func (m *middleware) endOrdered(ctx context.Context, a *admission, ok bool) {
	if a.ordered != (heldKey{}) {
		m.settled(ctx, a, ok)
	}
}
