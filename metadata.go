package outbox

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/recordstore"
)

// Metadata keys stamped into every tracked message.
const (
	// MetadataID holds the record id as decimal text.
	MetadataID = "outbox_id"
	// MetadataTopic holds the tracked topic, so the receiver finds the store.
	MetadataTopic = "outbox_topic"
	// MetadataTable holds the identity of the table the record lives in
	// ([recordstore.Store.Identity]), so that a receiver acts only on its own records.
	MetadataTable = "outbox_table"
	// MetadataConfirmTo holds the topic a receiver in another service
	// confirms its delivery to, in messages of a topic with remote
	// consumers ([Tracked.RemoteConsumers]).
	MetadataConfirmTo = "outbox_confirm_to"
	// MetadataOrderKey holds the message's order key (the value of its
	// [Tracked.OrderKey] metadata), and MetadataAfter the UUID of the
	// latest earlier message of that key not complete when it was sent,
	// in messages of a topic with an order key and remote consumers: a
	// remote consumer with an inbox handles the message only once that
	// one is in its inbox. MetadataReleasedFor names a remote consumer
	// for which the sender found every earlier message of the key
	// complete, or abandoned and skipped, since its inbox held the
	// message: it handles it without looking for MetadataAfter.
	MetadataOrderKey    = "outbox_order_key"
	MetadataAfter       = "outbox_after"
	MetadataReleasedFor = "outbox_released_for"
)

// outboxKeys are the metadata keys the outbox stamps. A message published
// again (after a failed send, or forwarded by a handler) is saved without
// them, so that its new record carries no stale id.
var outboxKeys = [...]string{MetadataID, MetadataTopic, MetadataTable, MetadataConfirmTo, MetadataOrderKey, MetadataAfter, MetadataReleasedFor}

// hasOutboxKeys reports whether md carries any outbox key.
func hasOutboxKeys(md map[string]string) bool {
	for _, k := range outboxKeys {
		if _, ok := md[k]; ok {
			return true
		}
	}
	return false
}

// withoutOutboxKeys returns md, or a copy of it without the outbox keys
// when it has any.
func withoutOutboxKeys(md map[string]string) map[string]string {
	if !hasOutboxKeys(md) {
		return md
	}
	out := make(map[string]string, len(md))
	for k, v := range md {
		out[k] = v
	}
	for _, k := range outboxKeys {
		delete(out, k)
	}
	return out
}

// parseID reads a record id from metadata text. It accepts only the canonical
// decimal form of a positive int64, so that every id the publisher stamps
// parses and nothing else does.
func parseID(text string) (int64, error) {
	id, err := strconv.ParseInt(text, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != text {
		return 0, fmt.Errorf("%w: %s %q is not a positive decimal id", ErrInvalidMetadata, MetadataID, truncate(text, 64))
	}
	return id, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

type recordKey struct{}

// RecordRef identifies the record of a message being handled, and the
// consumer handling it.
type RecordRef = observe.RecordRef

// delivery is what the middleware puts into the context of a tracked
// message while its handler runs.
type delivery struct {
	d     recordstore.Delivery
	store recordstore.Store
	// completed is set by CompleteTx: the handler's transaction completes
	// the record, so the middleware does not.
	completed atomic.Bool
}

// RecordFromContext returns the record of the tracked message being handled,
// from msg.Context() inside a handler wrapped by the outbox middleware,
// which removes the outbox keys from the metadata while the handler runs.
func RecordFromContext(ctx context.Context) (RecordRef, bool) {
	d, ok := ctx.Value(recordKey{}).(*delivery)
	if !ok {
		return RecordRef{}, false
	}
	return RecordRef{Topic: d.d.Topic, ID: d.d.ID, Consumer: d.d.Consumer}, true
}
