package outbox

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
)

// Metadata keys stamped into every tracked message.
const (
	// MetadataID holds the record id as decimal text.
	MetadataID = "outbox_id"
	// MetadataName holds the tracked name, so the receiver finds the store.
	MetadataName = "outbox_name"
)

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

// RecordRef identifies the record of a message being handled.
type RecordRef struct {
	Name string
	ID   int64
}

// delivery is what the middleware puts into the context of a tracked
// message while its handler runs.
type delivery struct {
	ref   RecordRef
	store Store
	// completed is set by CompleteTx: the handler's transaction completes
	// the record, so the middleware does not.
	completed atomic.Bool
}

// RecordFromContext returns the record of the tracked message being handled,
// read from the message's context (msg.Context()) inside a handler wrapped by
// the outbox middleware. The middleware removes the outbox keys from the
// message metadata before the handler runs, so that a handler which forwards
// the message does not forward a stale record id.
func RecordFromContext(ctx context.Context) (RecordRef, bool) {
	d, ok := ctx.Value(recordKey{}).(*delivery)
	if !ok {
		return RecordRef{}, false
	}
	return d.ref, true
}
