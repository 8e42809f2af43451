package outbox

// Receivers seen: the middleware and the confirmation handler tell the
// store which receivers check the records of each topic, so that its status
// reports the records that wait for a receiver never seen
// (recordstore.TopicStatus.Unchecked).

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/recordstore"
)

// receiverSeenEvery is how often a process records each receiver it sees:
// the status's last-seen times run up to this late.
const receiverSeenEvery = time.Minute

// receiverSeenTimeout bounds one write of a receiver seen.
const receiverSeenTimeout = 10 * time.Second

// processStart is the origin of the monotonic times kept in the slots.
var processStart = time.Now()

// seenSlot is the throttle of one receiver of the topic: a declared
// consumer's, local or remote, or the one of a topic that declares none.
// nil for a name the topic does not declare.
func (t *tracked) seenSlot(consumer string) *atomic.Int64 {
	if len(t.deliveries) == 0 {
		return &t.seenOne
	}
	if i := slices.Index(t.deliveries, consumer); i >= 0 {
		return &t.seen[i]
	}
	return nil
}

// foundRecord reports whether a check answered for the delivery's record,
// whatever the answer: the receiver is deployed and checks this store. A
// check that failed, or a consumer let through untracked, tells nothing.
func foundRecord(o CheckOutcome, err error) bool {
	switch o {
	case CheckUntracked:
		return false
	case CheckRefused:
		return errors.Is(err, recordstore.ErrNotDue) || errors.Is(err, recordstore.ErrLeased)
	}
	return true
}

// sawReceiver records, at most once per receiverSeenEvery and process,
// that consumer checked (or confirmed) a record of the topic, on a store
// that implements [recordstore.ConsumerRecorder]. The common case is one
// atomic load; the write runs in a goroutine of its own, off the handler's
// path, and its failure is logged at Debug only: the next one a minute
// later records the receiver.
func (r *Registry) sawReceiver(t *tracked, slot *atomic.Int64, consumer string, logger watermill.LoggerAdapter) {
	if slot == nil {
		return
	}
	now := int64(time.Since(processStart)) + 1 // 0 is never
	last := slot.Load()
	if last != 0 && now-last < int64(receiverSeenEvery) {
		return
	}
	rr, ok := t.store.(recordstore.ConsumerRecorder)
	if !ok || !slot.CompareAndSwap(last, now) {
		return
	}
	r.background.spawn(func() {
		ctx, cancel := context.WithTimeout(context.Background(), receiverSeenTimeout)
		defer cancel()
		if err := rr.SawConsumer(ctx, t.topic, consumer); err != nil {
			logger.Debug("Recording a receiver seen failed; the next check records it", watermill.LogFields{"topic": t.topic, "consumer": consumer, "error": err.Error()})
		}
	})
}
