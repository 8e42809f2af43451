package recordstore_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

// TestTopicStatusJSONRoundTrip: what MarshalJSON writes (ages in seconds,
// null when never seen) UnmarshalJSON reads back.
func TestTopicStatusJSONRoundTrip(t *testing.T) {
	t.Parallel()
	want := []recordstore.TopicStatus{
		{Topic: "orders", Pending: 2, OldestPending: 1500 * time.Millisecond, Abandoned: 1, Completed: 3, Unchecked: 2, Seen: true, SinceSeen: 41 * time.Second, HeldKeys: 4,
			Consumers: []recordstore.ConsumerStatus{
				{Consumer: "billing", Remote: true, Pending: 1, OldestPending: time.Second, Unchecked: 1},
				{Consumer: "shipping", Abandoned: 2, Completed: 5, Seen: true, SinceSeen: 250 * time.Millisecond},
			}},
		{Topic: "refunds"},
	}
	b, err := json.Marshal(want)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"oldest_pending_seconds":1.5`)
	assert.Contains(t, string(b), `"last_seen_seconds_ago":null`)
	var got []recordstore.TopicStatus
	require.NoError(t, json.Unmarshal(b, &got), "%s", b)
	assert.Equal(t, want, got)
}
