package outbox

import (
	"context"
	"fmt"

	"github.com/wmoutbox/outbox/recordstore"
)

// ReadStatus reports the records of every tracked name, in name order, from
// the stores that implement [recordstore.StatusReader]; a name whose store does not is
// left out, and a name without records reports zeros. With full false it
// reads only pending records (Abandoned and Completed stay zero), which is
// cheap enough for frequent health checks and metric scrapes. On a ctx
// without a deadline each store's read is bounded by
// [DefaultStatementTimeout].
func ReadStatus(ctx context.Context, reg *Registry, full bool) ([]TopicStatus, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	found := map[string]TopicStatus{}
	for _, t := range reg.stores() {
		name := t.name
		sr, ok := t.store.(recordstore.StatusReader)
		if !ok {
			continue
		}
		var sts []TopicStatus
		var err error
		sctx, cancel := withDefaultDeadline(ctx)
		if full {
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
	out := make([]TopicStatus, 0, len(reg.names))
	for _, t := range reg.entries() {
		if _, ok := t.store.(recordstore.StatusReader); !ok {
			continue
		}
		st := found[t.name]
		st.Topic = t.name
		out = append(out, st)
	}
	return out, nil
}

// TopicStatus is the state of one tracked topic's records, as [ReadStatus]
// and the status handler report it.
type TopicStatus = recordstore.TopicStatus

// ConsumerStatus is one declared consumer's share of a [TopicStatus].
type ConsumerStatus = recordstore.ConsumerStatus
