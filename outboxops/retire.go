package outboxops

import (
	"context"
	"fmt"
	"slices"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/recordstore"
)

// ErrConsumerDeclared is wrapped by the error of a retire that the store
// refuses because the latest start of a service on the table still
// declares the consumer ([recordstore.ConsumerDeclaredError] says which
// start, and when).
var ErrConsumerDeclared = recordstore.ErrConsumerDeclared

// RetireConsumer completes the pending deliveries of a consumer that the
// tracked topic no longer declares: one removed from
// [outbox.Tracked.Consumers], or the old name of a renamed one. Until it is
// retired, its deliveries keep their records pending, and every start,
// stale resubmit round and replay sends them again; [outbox.Replay] reports
// such a consumer at start. Each record whose other deliveries are
// complete is completed (marked, or deleted) with it. It returns how many
// deliveries it completed, in batches committed one by one, so a retire
// that fails half way can be run again.
//
// It refuses, with an error wrapping [outbox.ErrInvalidConfig], a topic the
// registry does not track and a consumer the topic still declares, and
// returns an error wrapping [outbox.ErrNotSupported] when the topic's store
// does not implement [recordstore.ConsumerRetirer]. The store refuses,
// with an error wrapping [ErrConsumerDeclared], a consumer that the latest
// start of a service sharing it still declares (an instance not yet
// redeployed). The command "outboxctl retire -topic T -consumer C" does
// the same from a shell, with the store's check alone.
func RetireConsumer(ctx context.Context, reg *outbox.Registry, topic, consumer string) (int, error) {
	if reg == nil {
		return 0, fmt.Errorf("%w: registry is nil", outbox.ErrInvalidConfig)
	}
	store := reg.Store(topic)
	switch {
	case store == nil:
		return 0, fmt.Errorf("%w: topic %q is not tracked", outbox.ErrInvalidConfig, topic)
	case consumer == "":
		return 0, fmt.Errorf("%w: no consumer to retire", outbox.ErrInvalidConfig)
	case slices.Contains(reg.Consumers(topic), consumer) || slices.Contains(reg.RemoteConsumers(topic), consumer):
		return 0, fmt.Errorf("%w: consumer %q is still declared by tracked topic %q; remove it from Tracked.Consumers (or RemoteConsumers) first", outbox.ErrInvalidConfig, consumer, topic)
	}
	r, ok := store.(recordstore.ConsumerRetirer)
	if !ok {
		return 0, fmt.Errorf("%w: %T cannot retire consumer %q of %q", outbox.ErrNotSupported, store, consumer, topic)
	}
	n, err := r.Retire(ctx, topic, consumer)
	if err != nil {
		return n, fmt.Errorf("retiring consumer %q of tracked topic %q: %w", consumer, topic, err)
	}
	return n, nil
}
