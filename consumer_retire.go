package outbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/recordstore"
)

// RetireConsumer completes the pending deliveries of a consumer that the
// tracked topic no longer declares: one removed from [Tracked.Consumers],
// or the old name of a renamed one. Until it is retired, its deliveries keep
// their records pending, and every start, stale resubmit round and replay
// sends them again; [Replay] reports such a consumer at start. Each record
// whose other deliveries are complete is completed (marked, or deleted)
// with it. It returns how many deliveries it completed, in batches
// committed one by one, so a retire that fails half way can be run again.
//
// It refuses, with an error wrapping [ErrInvalidConfig], a topic the
// registry does not track and a consumer the topic still declares, and
// returns an error wrapping [ErrNotSupported] when the topic's store does
// not implement [recordstore.ConsumerRetirer]. The store refuses, with an
// error wrapping [recordstore.ErrConsumerDeclared], a consumer that the
// latest start of a service sharing it still declares (an instance not yet
// redeployed). The command "outboxctl retire -topic T -consumer C" does
// the same from a shell, with the store's check alone.
func RetireConsumer(ctx context.Context, reg *Registry, topic, consumer string) (int, error) {
	if reg == nil {
		return 0, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	t := reg.lookup(topic)
	switch {
	case t == nil:
		return 0, fmt.Errorf("%w: topic %q is not tracked", ErrInvalidConfig, topic)
	case consumer == "":
		return 0, fmt.Errorf("%w: no consumer to retire", ErrInvalidConfig)
	case t.hasDelivery(consumer):
		return 0, fmt.Errorf("%w: consumer %q is still declared by tracked topic %q; remove it from Tracked.Consumers (or RemoteConsumers) first", ErrInvalidConfig, consumer, topic)
	}
	r, ok := t.store.(recordstore.ConsumerRetirer)
	if !ok {
		return 0, fmt.Errorf("%w: %T cannot retire consumer %q of %q", ErrNotSupported, t.store, consumer, topic)
	}
	n, err := r.Retire(ctx, topic, consumer)
	if err != nil {
		return n, fmt.Errorf("retiring consumer %q of tracked topic %q: %w", consumer, topic, err)
	}
	return n, nil
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
		"If it was removed, or renamed and the new name has caught up, retire it: outbox.RetireConsumer(ctx, reg, %q, %q), or outboxctl retire -topic %q -consumer %q. "+
		"If it still runs, declare it in Tracked.Consumers",
		c.Consumer, c.Pending, t.topic, declared, t.topic, c.Consumer, t.topic, c.Consumer)
}
