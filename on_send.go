package outbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/recordstore"
)

// completeSentTimeout bounds the completions of a topic that completes on
// send; the send already succeeded, so a completion that cannot finish
// leaves the record pending and it is sent again.
const completeSentTimeout = 10 * time.Second

// completeSent completes the records of a topic that completes on send,
// once the wrapped publisher accepted them. The completions run side by
// side, so that a store that combines concurrent completions sends one
// statement for the batch. A failure is logged and leaves the record
// pending, to be sent again: a duplicate, never a loss.
func completeSent(ctx context.Context, reg *Registry, t *tracked, records []recordstore.Record) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeSentTimeout)
	defer cancel()
	complete := func(rec recordstore.Record) {
		err := t.store.Complete(ctx, recordstore.Delivery{ID: rec.ID, Topic: t.topic, UUID: rec.UUID})
		switch {
		case err == nil:
			reg.observer().Completed(t.topic, "")
		case errors.Is(err, recordstore.ErrNotPending):
			// Sent twice (a replay beside the first send): complete already.
		default:
			reg.logger().Error("Completing a record on send failed; it stays pending and is sent again", err,
				watermill.LogFields{"topic": t.topic, "outbox_id": rec.ID, "message_uuid": rec.UUID})
		}
	}
	if len(records) == 1 {
		complete(records[0])
		return
	}
	var wg sync.WaitGroup
	for _, rec := range records {
		wg.Go(func() { complete(rec) })
	}
	wg.Wait()
}
