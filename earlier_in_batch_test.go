package outbox

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/wmoutbox/outbox/recordstore"
)

// TestEarlierInBatch: a record's earlier record of its key is the
// batch's own only when every id between the two is the batch's.
func TestEarlierInBatch(t *testing.T) {
	keyOf := func(r recordstore.Record) string { return r.OrderKey }
	recs := func(pairs ...any) []recordstore.Record {
		var out []recordstore.Record
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, recordstore.Record{ID: int64(pairs[i].(int)), OrderKey: pairs[i+1].(string)})
		}
		return out
	}
	for _, c := range []struct {
		name    string
		records []recordstore.Record
		earlier map[int64]int
		read    []int64
	}{
		{"ids one after the other", recs(10, "a", 11, "a", 12, "b", 13, "a", 14, "b"),
			map[int64]int{11: 0, 13: 1, 14: 2}, []int64{10, 12}},
		{"another insert drew an id in between", recs(10, "a", 11, "b", 13, "a", 14, "b"),
			map[int64]int{}, []int64{10, 11, 13, 14}},
		{"a gap after the key's record only", recs(10, "a", 12, "b", 13, "b", 14, "a"),
			map[int64]int{13: 1}, []int64{10, 12, 14}},
		{"records without a key wait for none", recs(10, "", 11, "a", 12, "", 13, "a"),
			map[int64]int{13: 1}, []int64{11}},
		{"a record saved before (same origin) breaks the run", recs(20, "a", 7, "a", 21, "a"),
			map[int64]int{}, []int64{20, 7, 21}},
	} {
		t.Run(c.name, func(t *testing.T) {
			earlier, read := earlierInBatch(c.records, keyOf)
			assert.Equal(t, c.earlier, earlier)
			assert.Equal(t, c.read, read)
		})
	}
}
