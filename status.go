package outbox

import (
	"context"
	"fmt"
	"slices"

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
// A consumer the topic declares in [Tracked.RemoteConsumers] is reported
// [ConsumerStatus].Remote, whatever the store keeps: its pending
// deliveries await its confirmation.
// On a ctx without a deadline each store's read is bounded by
// [DefaultStatementTimeout].
func ReadStatus(ctx context.Context, reg *Registry, opts StatusOptions) ([]TopicStatus, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	found := map[string]TopicStatus{}
	for _, t := range reg.stores() {
		name := t.topic
		sr, ok := t.store.(recordstore.StatusReader)
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
			return nil, fmt.Errorf("outbox: reading the status of %q: %w", name, err)
		}
		for _, st := range sts {
			found[st.Topic] = st
		}
	}
	out := make([]TopicStatus, 0, len(reg.topics))
	for _, t := range reg.entries() {
		if _, ok := t.store.(recordstore.StatusReader); !ok {
			continue
		}
		st := found[t.topic]
		st.Topic = t.topic
		for i := range st.Consumers {
			if slices.Contains(t.remote, st.Consumers[i].Consumer) {
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
