package pages_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/pages"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestPagesEndAtTheBudget reads ten pending records of 100
// bytes each from a real SQLite store with a budget of 250 bytes: a page
// ends with the record that reaches the budget, and the next read asks
// for as many records as fitted; without a budget a read asks for the
// configured count.
func TestPagesEndAtTheBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := testenv.Backends()[1]
	require.Equal(t, "SQLite", b.Name)
	db := b.Open(t)
	s := testenv.NewStore(t, b, db, sqlstore.Delete)
	recs := make([]recordstore.Record, 10)
	for i := range recs {
		recs[i] = recordstore.Record{Topic: "orders", UUID: "u" + string(rune('a'+i)), Payload: bytes.Repeat([]byte("x"), 100)}
	}
	require.NoError(t, s.Insert(ctx, recs))

	r := pages.New(8, 250)
	var sizes []int
	var after int64
	for {
		page, more, err := r.Pending(ctx, s, "orders", after)
		require.NoError(t, err)
		sizes = append(sizes, len(page))
		if len(page) > 0 {
			after = page[len(page)-1].ID
		}
		if !more {
			break
		}
	}
	assert.Equal(t, []int{3, 3, 3, 1}, sizes, "each page ends with the record that reaches 250 bytes")

	r = pages.New(8, 1<<20)
	page, more, err := r.Pending(ctx, s, "orders", 0)
	require.NoError(t, err)
	assert.Len(t, page, 8, "under the budget a read asks for the configured count")
	assert.True(t, more, "a full page may have more after it")
	page, more, err = r.Pending(ctx, s, "orders", page[len(page)-1].ID)
	require.NoError(t, err)
	assert.Len(t, page, 2)
	assert.False(t, more)
}
