package outbox

import (
	"context"

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
