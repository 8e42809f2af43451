package outbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/recordstore"
)

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
