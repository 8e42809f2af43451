package outbox

// First copies (MiddlewareConfig.Check.FirstCopies off): the publisher remembers
// the records it has just saved, and the first copy of each, per
// consumer, runs without the check.
//
// On a topic with an order key the publisher also asks the store, right
// after the insert, which earlier record of its key each new record waits
// for (recordstore.KeyPredecessors). The first copy of a record that waits
// for none, or for a record this consumer completed here, runs without the
// check: the earlier records of its key are done. When that record is on
// its way here (its first copy not yet delivered, its handler running or
// its completion not yet committed), the copy waits for it off the
// handler's path (ordering.go's park) and is sent again once it completed,
// so that a crash cannot make the earlier record run again after this one
// and the subscription goes on meanwhile. Any other copy is checked, and
// held as ordering.go says.

import (
	"context"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// skipsCheck reports whether the delivery of a may run without the check
// (MiddlewareConfig.Check.FirstCopies). On a topic with an order key it
// returns instead, as before, the earlier record of the key that is on its
// way here and that the copy is to wait for off the handler's path (park).
func (m *middleware) skipsCheck(ctx context.Context, a *admission) (skip bool, before int64) {
	if m.cfg.Check.FirstCopies || a.d.UUID == "" || leases(a.t.store) {
		return false, 0
	}
	consumers := max(len(a.t.consumers), 1)
	if a.t.orderKey == "" {
		return a.t.firstCopies.Take(a.d, consumers), 0
	}
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

// leases reports whether the store has a delivery lease, which the check
// takes.
func leases(s recordstore.Store) bool {
	l, ok := s.(interface{ Lease() time.Duration })
	return !ok || l.Lease() > 0
}
