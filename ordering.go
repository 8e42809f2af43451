package outbox

// Ordering: what the middleware does with a copy whose record an earlier
// record of its key holds (Tracked.OrderKey), and how a held record comes
// back once its key is free.
//
// A first copy whose earlier record is on its way in this process (not yet
// delivered here, or running) is parked (park): acknowledged unrun and
// sent again through the registry's sender once that record completed
// here, or as a checked copy after Check.HeldWait (longer while that
// record is still on its way here: stillComing). Every other held copy is
// checked, and is held as follows.
//
// A held copy first waits, in the handler, for the earlier record to
// complete in this process (a completion wakes it at once), up to
// MiddlewareConfig.Check.HeldWait, and is checked again. If the key is still held
// it is put back: acknowledged without running the handler, its record
// left pending. Nacking instead would spin, or stall the key for good, on
// brokers that redeliver a nacked message in place (GoChannel, Kafka, the
// SQL pub/sub): the held copy would stay in front of the earlier record's
// copy. A record put back is marked so in the store
// (recordstore.KeyClaimer.PutBack); each completion of a record of the key,
// in any instance, claims the next one put back (or last sent more than
// Check.HeldWait ago) and sends it again at once, and the stale resubmitter finds
// it stale at its next round. The copy is checked once more after it was
// marked, so that a completion between its check and the mark is not
// missed. A first copy that runs without the check (first_copy.go)
// completes in the background, as on a topic without a key; a checked copy
// completes on the handler's path, since held copies wait for it. The
// completion of a checked copy, or of a record of a key this process put
// back, claims the key's next record at once; those of unchecked copies
// are gathered for Complete.BatchWait (5 ms at most), and one statement
// (recordstore.KeyWaiters) names the keys whose next record waits to be
// sent. Meanwhile the record that holds the
// key is sent again at once when its last send is older than
// MiddlewareConfig.Check.HeldResendAfter (its copy may be lost), claimed the
// same way, so that all the held copies of every instance send it at most
// once per Check.HeldResendAfter. The stale resubmitter and the next replay send
// whatever a crash left behind.

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/internal/keyorder"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/recordstore"
)

// heldKey names one consumer's delivery of one record of a topic.
type heldKey = keyorder.Key

// heldHere is the check's outcome for a first copy whose earlier record
// of its key is on its way in this process (first_copy.go): the copy
// waits for it off the handler's path (park).
type heldHere struct{ before int64 }

func (e *heldHere) Error() string {
	return "held by record " + strconv.FormatInt(e.before, 10) + " of its key, on its way in this process"
}

func (e *heldHere) Unwrap() error { return recordstore.ErrHeld }

// park acknowledges the first copy of a record held by before, an earlier
// record of its key on its way in this process, without running its
// handler, so that the subscription delivers the next message meanwhile
// (before's own copy, often). Once before completed here the copy is sent
// again through the registry's sender, as its consumer's first copy still,
// and runs unchecked; if before did not complete here within Check.HeldWait, the
// copy is sent again as a copy already delivered, which is checked and
// held as any other. Its record stays pending all along: a crash, or a
// failed send, leaves it to the stale resubmitter and the next replay.
func (m *middleware) park(msg *message.Message, a *admission, before int64) ([]*message.Message, error) {
	res := m.reg.resends()
	if res == nil {
		// The sender stopped since the check: checked as any copy.
		msg.Nack()
		return nil, nil
	}
	wake, stop := a.t.holds.Wait(heldKey{Consumer: a.d.Consumer, ID: before})
	parked := msg.Copy()
	parked.SetContext(context.WithoutCancel(msg.Context()))
	m.logger.Debug("Record held by an earlier record of its key on its way here; sending the copy again once it completes", a.fields.Add(watermill.LogFields{"held_by": before}))
	a.t.waiting.Store(a.d.ID, struct{}{})
	m.reg.background.Spawn(func() {
		wait := m.cfg.Check.HeldWait
		budget := time.NewTimer(wait)
		defer budget.Stop()
		start := time.Now()
	parked:
		for {
			select {
			case <-wake:
				break parked
			case <-budget.C:
				if a.t.stillComing(m.reg, before, a.d.Consumer, wait, time.Since(start)) {
					budget.Reset(wait)
					continue
				}
				// Sent again as a delivered copy: checked, not parked again.
				a.t.firstCopies.Take(a.d, max(len(a.t.consumers), 1))
				break parked
			}
		}
		stop()
		a.t.firstCopies.Resent(a.d.ID)
		a.t.waiting.Delete(a.d.ID)
		if err := res.sendCopies(a.t, parked); err != nil {
			m.logger.Error("Sending a held copy again failed; the stale resubmitter or the next replay sends it", err, a.fields)
		}
	})
	return nil, nil
}

// refusedOrdered acts on a refused check of an ordered topic's copy: a
// copy held by an earlier record of its key waits for it (park, onHeld);
// any other refusal is acted on as for any topic.
func (m *middleware) refusedOrdered(h message.HandlerFunc, msg *message.Message, idText string, a *admission, err error) ([]*message.Message, error) {
	var here *heldHere
	var held *recordstore.HeldError
	switch {
	case errors.As(err, &here):
		return m.park(msg, a, here.before)
	case errors.As(err, &held):
		return m.onHeld(h, msg, idText, a, held)
	}
	return m.after(h, msg, a, observe.CheckRefused, err)
}

// onHeld handles a copy whose record is held by an earlier record of its
// key: while that record's handler runs here, it waits for it to complete,
// up to Check.HeldWait, checking again each time one does; otherwise, or then,
// it puts the copy back.
func (m *middleware) onHeld(h message.HandlerFunc, msg *message.Message, idText string, a *admission, held *recordstore.HeldError) ([]*message.Message, error) {
	ctx := msg.Context()
	budget := time.NewTimer(m.cfg.Check.HeldWait)
	defer budget.Stop()
	m.logger.Debug("Record held by an earlier record of its key, waiting for it", a.fields.Add(watermill.LogFields{"held_by": held.Before}))
	over, woken := false, false
	for {
		if !held.Abandoned {
			m.askResend(a, held.Before)
		}
		if !a.t.holds.Runs(heldKey{Consumer: a.d.Consumer, ID: held.Before}) && !woken {
			// Not running here: waiting would hold the subscription (a
			// GoChannel or Kafka partition delivers one message at a
			// time) in front of the copy that can run.
			return m.putBack(h, msg, a, held)
		}
		if !over {
			wake, stop := a.t.holds.Wait(heldKey{Consumer: a.d.Consumer, ID: held.Before})
			if woken {
				// Woken by this record before, and still held by it:
				// wait out the budget.
				wake = nil
			}
			select {
			case <-wake:
			case <-budget.C:
				over = true
			case <-ctx.Done():
				over = true
			}
			stop()
		}
		// Checked again: the earlier record completed (here or, when the
		// wait is over, maybe elsewhere), or another holds the key now.
		before := held.Before
		next, o, err := m.admit(msg, idText)
		if o == observe.CheckPending {
			return m.runOrdered(h, msg, next)
		}
		if !errors.As(err, &held) {
			return m.after(h, msg, next, o, err)
		}
		a = next
		if over {
			return m.putBack(h, msg, a, held)
		}
		woken = held.Before == before
	}
}

// putBack acknowledges a held copy without running its handler; its record
// stays pending and is sent again once a record of its key completes. Without a
// sender (no replay or stale resubmitter was built on the registry) or a
// store that claims keys, it is nacked instead, for the broker to bring
// it back.
func (m *middleware) putBack(h message.HandlerFunc, msg *message.Message, a *admission, held *recordstore.HeldError) ([]*message.Message, error) {
	fields := a.fields.Add(watermill.LogFields{"held_by": held.Before, "held_by_abandoned": held.Abandoned})
	claimer, ok := a.t.store.(recordstore.KeyClaimer)
	if !ok || m.reg.resends() == nil {
		m.logger.Debug("Record held by an earlier record of its key, nacking the copy", fields)
		msg.Nack()
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), m.cfg.Complete.Timeout)
	defer cancel()
	if err := claimer.PutBack(ctx, a.t.topic, a.d.ID); err != nil {
		m.logger.Error("Putting a held record back failed; nacking the copy", err, fields)
		msg.Nack()
		return nil, nil
	}
	// The record that held it may have completed since the check, before
	// its completion could see the record put back: checked once more.
	if next, o, err := m.admit(msg, a.idText); o == observe.CheckPending {
		return m.runOrdered(h, msg, next)
	} else if !errors.Is(err, recordstore.ErrHeld) {
		return m.after(h, msg, next, o, err)
	}
	if a.key != "" {
		a.t.holds.PutBack.Store(a.key, struct{}{})
	}
	m.logger.Debug("Record held by an earlier record of its key, putting the copy back", fields)
	return nil, nil
}

// runOrdered runs an admitted delivery of an ordered topic, unless a copy
// of its record runs here already, which is nacked after LeasedNackDelay,
// as a copy of a leased record is.
func (m *middleware) runOrdered(h message.HandlerFunc, msg *message.Message, a *admission) ([]*message.Message, error) {
	k := heldKey{Consumer: a.d.Consumer, ID: a.d.ID}
	if !a.t.holds.ClaimRun(k) {
		m.logger.Debug("A copy of the record runs already, nacking this one", a.fields)
		// A lease this check may have taken must not outlive the copy.
		m.release(msg.Context(), a)
		m.hold(msg.Context(), m.cfg.Check.LeasedNackDelay)
		msg.Nack()
		return nil, nil
	}
	a.ordered = k
	return m.settle(h, msg, a)
}

// settled ends an ordered delivery's run: after its completion (ok) the
// copies waiting for it here are woken, and the next record of its key
// that was put back (or last sent more than Check.HeldWait ago) is sent again.
func (m *middleware) settled(ctx context.Context, a *admission, ok bool) {
	a.t.holds.EndRun(a.ordered)
	if !ok {
		return
	}
	woke := a.t.holds.Done(a.ordered)
	a.t.holds.Asked.Delete(a.d.ID)
	if a.key == "" {
		return
	}
	if a.t.deferred.release(m.reg, a.t, a.d.ID) || woke {
		// The key's next record, held here, is sent now: no claim.
		return
	}
	if _, ok := a.t.holds.PutBack.LoadAndDelete(a.key); ok || !a.unchecked {
		m.reg.background.Spawn(func() { m.claimAndSend(context.WithoutCancel(ctx), a, a.d.ID, m.cfg.Check.HeldWait) })
		return
	}
	a.t.claims.add(m, a)
}

// keyClaims gathers the keys whose records completed within
// Complete.BatchWait (claimWait at most), so that one statement (recordstore.KeyWaiters) finds
// those whose next record waits to be sent again, and only theirs are
// claimed.
type keyClaims struct {
	mu sync.Mutex
	// last is, per key, the delivery of its latest record that completed.
	last     map[string]*admission
	flushing bool
}

// add counts a's completion in the next batch of claims.
func (c *keyClaims) add(m *middleware, a *admission) {
	c.mu.Lock()
	if c.last == nil {
		c.last = map[string]*admission{}
	}
	if prev := c.last[a.key]; prev == nil || prev.d.ID < a.d.ID {
		c.last[a.key] = a
	}
	start := !c.flushing
	c.flushing = true
	c.mu.Unlock()
	if start {
		m.reg.background.Spawn(func() { m.claimBatch(a.t) })
	}
}

// claimWait is how long the completions of unchecked copies of an ordered
// topic are gathered at most before the keys' next records are claimed:
// shorter than the default Complete.BatchWait, since each waits on it.
const claimWait = 5 * time.Millisecond

// claimBatch waits Complete.BatchWait, claimWait at most, for the
// completions of t's batch, then claims and sends the next record of each
// key that has one waiting.
func (m *middleware) claimBatch(t *tracked) {
	<-time.After(min(m.cfg.Complete.BatchWait, claimWait))
	c := &t.claims
	c.mu.Lock()
	batch := c.last
	c.last, c.flushing = nil, false
	c.mu.Unlock()
	keys := make([]string, 0, len(batch))
	for k := range batch {
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return
	}
	if kw, ok := t.store.(recordstore.KeyWaiters); ok {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Complete.Timeout)
		waiting, err := kw.WaitingKeys(ctx, t.topic, keys, m.cfg.Check.HeldWait)
		cancel()
		if err != nil {
			m.logger.Error("Reading which order keys wait for a send failed; claiming the next record of each", err, watermill.LogFields{"topic": t.topic, "keys": len(keys)})
		} else {
			keys = waiting
		}
	}
	for _, k := range keys {
		if a := batch[k]; a != nil {
			m.claimAndSend(context.Background(), a, a.d.ID, m.cfg.Check.HeldWait)
		}
	}
}

// askResend sends the record before, which holds a's key, again when its
// last send is older than Check.HeldResendAfter, at most once per Check.HeldResendAfter
// per record and process (and, through the store's claim, across
// processes).
func (m *middleware) askResend(a *admission, before int64) {
	if a.key == "" {
		return
	}
	now := time.Now().UnixNano()
	v, _ := a.t.holds.Asked.LoadOrStore(before, new(atomic.Int64))
	last := v.(*atomic.Int64)
	prev := last.Load()
	if prev != 0 && now-prev < int64(m.cfg.Check.HeldResendAfter) || !last.CompareAndSwap(prev, now) {
		return
	}
	m.reg.background.Spawn(func() { m.claimAndSend(context.Background(), a, before-1, m.cfg.Check.HeldResendAfter) })
}

// claimAndSend claims the first record of a's key after afterID whose last
// send is older than olderThan and sends it through the registry's sender;
// a failure is logged, and the record stays pending for the next resend.
func (m *middleware) claimAndSend(ctx context.Context, a *admission, afterID int64, olderThan time.Duration) {
	res := m.reg.resends()
	claimer, ok := a.t.store.(recordstore.KeyClaimer)
	if res == nil || !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Complete.Timeout)
	defer cancel()
	recs, err := claimer.ClaimKey(ctx, a.t.topic, a.key, afterID, max(olderThan, time.Microsecond))
	if err == nil && len(recs) > 0 {
		var identity string
		if identity, err = a.t.store.Identity(ctx); err == nil {
			err = res.send(ctx, a.t, identity, recs)
		}
	}
	if err != nil {
		m.logger.Error("Sending the next record of an order key again failed; the stale resubmitter or the next replay sends it", err, a.fields)
	}
}

// skipsOrderedCheck reports whether the delivery of a, on a topic with an
// order key, may run without the check, or returns instead the earlier
// record of its key that is on its way here and that the copy is to wait
// for off the handler's path (park).
func (m *middleware) skipsOrderedCheck(ctx context.Context, a *admission) (skip bool, before int64) {
	if !m.skipsFirstChecks(a) {
		return false, 0
	}
	consumers := max(len(a.t.consumers), 1)
	before, first := a.t.firstCopies.Peek(a.d)
	if !first {
		return false, 0
	}
	if before != 0 && !a.t.holds.Completed(heldKey{Consumer: a.d.Consumer, ID: before}) {
		if _, ok := a.t.completing.Load(completingKey{id: before, consumer: a.d.Consumer}); !ok && m.reg.resends() != nil && a.t.onItsWayHere(before, a.d.Consumer) {
			// Not taken: the copy sent again once before completed is
			// the first copy still.
			return false, before
		}
	}
	if !a.t.firstCopies.Take(a.d, consumers) {
		return false, 0
	}
	if a.t.holds.WaitedOn(heldKey{Consumer: a.d.Consumer, ID: a.d.ID}) {
		// A later record's first copy came first, and waits for this
		// one: the broker reorders this process's keyed messages.
		a.t.deferred.sawReorder()
	}
	if before == 0 || a.t.holds.Completed(heldKey{Consumer: a.d.Consumer, ID: before}) {
		// The earlier records of its key are done.
		a.unchecked = true
		return true, 0
	}
	if c, ok := a.t.completing.Load(completingKey{id: before, consumer: a.d.Consumer}); ok {
		// The earlier record's handler ran here and its completion is on
		// its way (a broker that keeps order delivers this copy right
		// after it): the copy waits for it in the handler, and runs once
		// it committed, never before, so that a crash cannot make the
		// earlier record run again after this one.
		c := c.(*completion)
		select {
		case <-c.done:
		case <-ctx.Done():
			return false, 0
		}
		a.unchecked = c.ok
		return c.ok, 0
	}
	return false, 0
}
