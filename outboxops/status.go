package outboxops

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/recordstore"
)

// StatusOptions choose what [ReadStatus] reads.
type StatusOptions struct {
	// Full also counts abandoned and completed records. Without it only
	// pending records are read (Abandoned and Completed stay zero), which
	// is cheap enough for frequent health checks and metric scrapes.
	Full bool
}

// ReadStatus reports the records of every tracked topic, in topic order,
// from the stores that implement [recordstore.StatusReader]; a topic whose
// store does not is left out, and a topic without records reports zeros.
// A consumer the topic declares in [outbox.Tracked.RemoteConsumers] is reported
// [ConsumerStatus].Remote, whatever the store keeps: its pending
// deliveries await its confirmation.
// On a ctx without a deadline each store's read is bounded by
// [outbox.DefaultStatementTimeout].
func ReadStatus(ctx context.Context, reg *outbox.Registry, opts StatusOptions) ([]TopicStatus, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", outbox.ErrInvalidConfig)
	}
	found := map[string]TopicStatus{}
	for _, store := range stores(reg) {
		sr, ok := store.(recordstore.StatusReader)
		if !ok {
			continue
		}
		var sts []TopicStatus
		var err error
		sctx, cancel := withDefaultDeadline(ctx)
		if opts.Full {
			sts, err = sr.Status(sctx)
		} else {
			sts, err = sr.PendingStatus(sctx)
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("outbox: reading the status of the store of %q: %w", firstTopicOf(reg, store), err)
		}
		for _, st := range sts {
			found[st.Topic] = st
		}
	}
	out := make([]TopicStatus, 0, len(reg.Topics()))
	for _, topic := range reg.Topics() {
		if _, ok := reg.Store(topic).(recordstore.StatusReader); !ok {
			continue
		}
		st := found[topic]
		st.Topic = topic
		remote := reg.RemoteConsumers(topic)
		for i := range st.Consumers {
			if slices.Contains(remote, st.Consumers[i].Consumer) {
				st.Consumers[i].Remote = true
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// TopicStatus is the state of one tracked topic's records, as [ReadStatus]
// and the status handler report it.
type TopicStatus = recordstore.TopicStatus

// ConsumerStatus is one declared consumer's share of a [TopicStatus].
type ConsumerStatus = recordstore.ConsumerStatus

// stores are the registry's stores, each once, in the order of their
// first topic.
func stores(reg *outbox.Registry) []recordstore.Store {
	var out []recordstore.Store
	for _, topic := range reg.Topics() {
		s := reg.Store(topic)
		if !slices.ContainsFunc(out, func(o recordstore.Store) bool { return sameStore(o, s) }) {
			out = append(out, s)
		}
	}
	return out
}

// firstTopicOf is the first topic of reg that saves into store.
func firstTopicOf(reg *outbox.Registry, store recordstore.Store) string {
	for _, topic := range reg.Topics() {
		if sameStore(reg.Store(topic), store) {
			return topic
		}
	}
	return ""
}

// sameStore reports whether a and b are one store: equal values of a
// comparable type.
func sameStore(a, b recordstore.Store) bool {
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// withDefaultDeadline bounds ctx by outbox.DefaultStatementTimeout,
// unless it has a deadline already.
func withDefaultDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, outbox.DefaultStatementTimeout)
}
