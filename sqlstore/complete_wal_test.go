package sqlstore_test

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestCoalescedCompletionWritesNoRowLock: on PostgreSQL, the completions
// of the coalesced path write each completed row once to the WAL (its
// delete, or its new version on a marking table) and lock no row first: a
// FOR UPDATE … SKIP LOCKED lookup wrote a lock record per row, as large as
// the delete's. The WAL is read with pg_walinspect, by the table's own
// file. Topology: one store, one topic, 40 deliveries completing at once.
func TestCoalescedCompletionWritesNoRowLock(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := testCtx(t)
	if _, err := db.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err != nil {
		t.Skipf("PostgreSQL's pg_walinspect extension (contrib, PostgreSQL 15 or newer) is not available: %v", err)
	}
	for _, mode := range []sqlstore.Completion{sqlstore.Delete, sqlstore.Mark} {
		t.Run(mode.String(), func(t *testing.T) {
			b := testenv.Backends()[0]
			s := testenv.NewStore(t, b, db, mode)
			recs := make([]recordstore.Record, 40)
			for i := range recs {
				recs[i] = recordstore.Record{Topic: "orders", UUID: "u" + strconv.Itoa(i), Payload: []byte("x")}
			}
			require.NoError(t, s.Insert(ctx, recs))
			var file string
			require.NoError(t, db.GetContext(ctx, &file, "SELECT pg_relation_filenode($1::regclass)::text", s.Table()))
			// The insert's commit waited for the disk: the WAL is flushed
			// up to here.
			var from string
			require.NoError(t, db.GetContext(ctx, &from, "SELECT pg_current_wal_flush_lsn()::text"))

			var wg sync.WaitGroup
			errs := make([]error, len(recs))
			for i, r := range recs {
				wg.Go(func() {
					errs[i] = s.Complete(ctx, recordstore.Delivery{ID: r.ID, Topic: "orders", Consumer: "ship", UUID: r.UUID})
				})
			}
			wg.Wait()
			for i, err := range errs {
				require.NoError(t, err, "delivery %d", i)
			}
			// The completions commit without waiting for the disk; an
			// insert's commit waits, and flushes the WAL up to it.
			require.NoError(t, s.Insert(ctx, []recordstore.Record{{Topic: "flush", UUID: "flush", Payload: []byte("x")}}))
			var to string
			require.NoError(t, db.GetContext(ctx, &to, "SELECT pg_current_wal_flush_lsn()::text"))

			counts := heapRecords(t, db, file, from, to)
			written := counts["DELETE"]
			if mode == sqlstore.Mark {
				written = counts["HOT_UPDATE"] + counts["UPDATE"]
			}
			assert.Equal(t, len(recs), written, "each completed row written once: %v", counts)
			assert.Zero(t, counts["LOCK"], "rows locked before their completion: %v", counts)
		})
	}
}

// TestCompletionOfARowLockedBefore: a record whose row a transaction
// locked and left unchanged (a SELECT … FOR UPDATE that committed) is not
// taken by the coalesced path's lookup, which takes only rows that no
// transaction has locked since they were written; it completes alone, and
// is completed all the same. PostgreSQL, both completion modes.
func TestCompletionOfARowLockedBefore(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := testCtx(t)
	for _, mode := range []sqlstore.Completion{sqlstore.Delete, sqlstore.Mark} {
		t.Run(mode.String(), func(t *testing.T) {
			s := testenv.NewStore(t, testenv.Backends()[0], db, mode)
			recs := []recordstore.Record{{Topic: "orders", UUID: "locked", Payload: []byte("x")}}
			require.NoError(t, s.Insert(ctx, recs))
			tx, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, "SELECT id FROM "+s.Table()+" WHERE id = $1 FOR UPDATE", recs[0].ID)
			require.NoError(t, err)
			require.NoError(t, tx.Commit())

			d := recordstore.Delivery{ID: recs[0].ID, Topic: "orders", Consumer: "ship", UUID: "locked"}
			require.NoError(t, s.Complete(ctx, d))
			pending, err := s.PendingAfter(ctx, "orders", 0, 10)
			require.NoError(t, err)
			assert.Empty(t, pending)
			assert.ErrorIs(t, s.Complete(ctx, d), recordstore.ErrNotPending)
		})
	}
}

// heapRecords counts, by type, the heap WAL records between two LSNs that
// write the relation file file.
func heapRecords(t *testing.T, db *sqlx.DB, file, from, to string) map[string]int {
	t.Helper()
	var records []struct {
		Manager string  `db:"resource_manager"`
		Type    string  `db:"record_type"`
		Blocks  *string `db:"block_ref"`
	}
	require.NoError(t, db.SelectContext(testCtx(t), &records, "SELECT resource_manager, record_type, block_ref FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)", from, to))
	counts := map[string]int{}
	for _, r := range records {
		if r.Manager == "Heap" && r.Blocks != nil && strings.Contains(*r.Blocks, "/"+file+" ") {
			counts[r.Type]++
		}
	}
	return counts
}

// TestCleanWritesNoRowLock: on PostgreSQL, a batch of the Cleaner deletes
// each old completed record with one WAL record and locks none first
// (FOR UPDATE wrote a lock record per row beside its delete).
func TestCleanWritesNoRowLock(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := testCtx(t)
	if _, err := db.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err != nil {
		t.Skipf("PostgreSQL's pg_walinspect extension (contrib, PostgreSQL 15 or newer) is not available: %v", err)
	}
	s := testenv.NewStore(t, testenv.Backends()[0], db, sqlstore.Mark)
	recs := make([]recordstore.Record, 40)
	for i := range recs {
		recs[i] = recordstore.Record{Topic: "orders", UUID: "u" + strconv.Itoa(i), Payload: []byte("x")}
	}
	require.NoError(t, s.Insert(ctx, recs))
	for _, r := range recs {
		require.NoError(t, s.Complete(ctx, recordstore.Delivery{ID: r.ID, Topic: "orders", Consumer: "ship", UUID: r.UUID}))
	}
	_, err := db.ExecContext(ctx, "UPDATE "+s.Table()+" SET processed_at = processed_at - interval '2 hours'")
	require.NoError(t, err)
	var file, from string
	require.NoError(t, db.GetContext(ctx, &file, "SELECT pg_relation_filenode($1::regclass)::text", s.Table()))
	require.NoError(t, db.GetContext(ctx, &from, "SELECT pg_current_wal_flush_lsn()::text"))
	n, err := s.Clean(ctx, time.Hour, 1000)
	require.NoError(t, err)
	require.Equal(t, len(recs), n)
	require.NoError(t, s.Insert(ctx, []recordstore.Record{{Topic: "flush", UUID: "flush", Payload: []byte("x")}}))
	var to string
	require.NoError(t, db.GetContext(ctx, &to, "SELECT pg_current_wal_flush_lsn()::text"))
	counts := heapRecords(t, db, file, from, to)
	assert.Equal(t, len(recs), counts["DELETE"], "each cleaned row deleted once: %v", counts)
	assert.Zero(t, counts["LOCK"], "rows locked before they were cleaned: %v", counts)
}
