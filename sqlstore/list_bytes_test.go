package sqlstore_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestListStopsAtTheByteBudget: an operator's page of records with large
// payloads holds about the byte budget, not the limit's worth of payloads.
func TestListStopsAtTheByteBudget(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		store := testenv.NewStore(t, b, b.Open(t), sqlstore.Mark)
		const mib = 1 << 20
		for i := range 5 {
			rec := []recordstore.Record{{Topic: "orders", UUID: fmt.Sprintf("big-%d", i), Payload: bytes.Repeat([]byte{'x'}, 4*mib)}}
			require.NoError(t, store.Insert(ctx, rec))
		}
		page, err := store.Operator().List(ctx, sqlstore.RecordFilter{}, 0, 10, 8*mib)
		require.NoError(t, err)
		assert.Len(t, page, 2, "the record that reaches 8 MiB ends the page")
		all, err := store.Operator().List(ctx, sqlstore.RecordFilter{}, page[len(page)-1].ID, 10, 0)
		require.NoError(t, err)
		assert.Len(t, all, 3, "the rest, unbounded")
	})
}
