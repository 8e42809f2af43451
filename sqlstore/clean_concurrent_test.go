package sqlstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestCleanWhilePublishing: the Cleaner deletes completed records in
// batches while publishers insert new ones into the same table. No insert
// fails (on MariaDB the cleaning's locking read once took gap locks that new
// rows wait for, and InnoDB cancelled the insert as a deadlock victim), and
// the Cleaner deletes exactly the completed records.
func TestCleanWhilePublishing(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		db := b.Open(t)
		s := testenv.NewStore(t, b, db, sqlstore.Mark)
		const completed = 5000
		var ids []int64
		for len(ids) < completed {
			recs := make([]recordstore.Record, 500)
			for i := range recs {
				recs[i] = recordstore.Record{Topic: "orders", UUID: fmt.Sprint(len(ids) + i), Payload: []byte("{}")}
			}
			require.NoError(t, s.Insert(ctx, recs))
			for _, r := range recs {
				ids = append(ids, r.ID)
			}
		}
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < len(ids); i += 8 {
					assert.NoError(t, s.Complete(ctx, recordstore.Delivery{ID: ids[i], Topic: "orders", Consumer: "handler"}))
				}
			})
		}
		wg.Wait()

		cleaning, stop := context.WithCancel(ctx)
		var inserted atomic.Int64
		var failures []error
		var mu sync.Mutex
		for w := range 4 {
			wg.Go(func() {
				for i := 0; cleaning.Err() == nil; i++ {
					recs := []recordstore.Record{{Topic: "orders", UUID: fmt.Sprintf("new-%d-%d", w, i), Payload: []byte("{}")}}
					if err := s.Insert(ctx, recs); err != nil {
						mu.Lock()
						failures = append(failures, err)
						mu.Unlock()
						continue
					}
					inserted.Add(1)
				}
			})
		}
		cleaned := 0
		for {
			n, err := s.Clean(ctx, 0, 250)
			require.NoError(t, err)
			cleaned += n
			if n == 0 {
				break
			}
		}
		stop()
		wg.Wait()
		t.Logf("%s: cleaned %d completed records while %d were inserted", b.Name, cleaned, inserted.Load())
		assert.Empty(t, failures, "no insert fails while the Cleaner runs")
		assert.Equal(t, completed, cleaned)
		var left int
		require.NoError(t, db.GetContext(ctx, &left, "SELECT COUNT(*) FROM "+s.Table()))
		assert.EqualValues(t, inserted.Load(), left, "every new record is kept")
	})
}
