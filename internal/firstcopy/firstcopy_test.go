package firstcopy

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/wmoutbox/outbox/recordstore"
)

func delivery(id int64, uuid, consumer string) recordstore.Delivery {
	return recordstore.Delivery{ID: id, UUID: uuid, Consumer: consumer}
}

// TestEachConsumerTakesItsFirstCopyOnce: a saved record's first copy is
// taken once per consumer, and forgotten once every consumer took it; a
// copy naming another message is never a first copy.
func TestEachConsumerTakesItsFirstCopyOnce(t *testing.T) {
	var s Set
	s.Saved([]recordstore.Record{{ID: 1, UUID: "a"}, {ID: 2, UUID: ""}}, nil)
	assert.False(t, s.Take(delivery(1, "forged", "ship"), 2), "another message's copy")
	assert.True(t, s.Take(delivery(1, "a", "ship"), 2))
	assert.False(t, s.Take(delivery(1, "a", "ship"), 2), "ship's second copy")
	assert.True(t, s.Coming(1, "stats"), "stats has yet to take it")
	assert.True(t, s.Take(delivery(1, "a", "stats"), 2))
	assert.False(t, s.Coming(1, "stats"))
	assert.False(t, s.Take(delivery(2, "", "ship"), 2), "a record without a UUID is not remembered")
}

// TestPeekNamesTheEarlierRecordWithoutTakingIt: on an ordered topic only
// the records the store named a predecessor for are remembered, and Peek
// reads one without counting it taken.
func TestPeekNamesTheEarlierRecordWithoutTakingIt(t *testing.T) {
	var s Set
	s.Saved([]recordstore.Record{{ID: 5, UUID: "e"}, {ID: 6, UUID: "f"}, {ID: 7, UUID: "g"}}, map[int64]int64{5: 0, 6: 5})
	before, first := s.Peek(delivery(6, "f", "ship"))
	assert.True(t, first)
	assert.Equal(t, int64(5), before)
	before, first = s.Peek(delivery(6, "f", "ship"))
	assert.True(t, first, "peeking takes nothing")
	assert.Equal(t, int64(5), before)
	_, first = s.Peek(delivery(7, "g", "ship"))
	assert.False(t, first, "no predecessor named: checked")
}

// TestTheOldestRecordsAreForgotten: beyond kept records the oldest one is
// forgotten, and its copy is checked as any.
func TestTheOldestRecordsAreForgotten(t *testing.T) {
	var s Set
	recs := make([]recordstore.Record, kept+1)
	for i := range recs {
		recs[i] = recordstore.Record{ID: int64(i + 1), UUID: "u"}
	}
	s.Saved(recs, nil)
	assert.False(t, s.Take(delivery(1, "u", "ship"), 1), "the first of kept+1")
	assert.True(t, s.Take(delivery(2, "u", "ship"), 1))
}
