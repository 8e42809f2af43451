package sqlstore_test

import (
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestCombinedCompletionLooksUpByPrimaryKey: on PostgreSQL, the combined
// completion of a few records in a table with a large backlog finds each
// by its primary key. Written as id = ANY($1), the planner scanned the
// whole pending index for them (its first column is the topic), so that
// every completion cost time in proportion to the backlog.
func TestCombinedCompletionLooksUpByPrimaryKey(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			s := testenv.NewStore(t, testenv.Backends()[0], db, mode)
			for range 20 {
				recs := make([]recordstore.Record, 1000)
				for i := range recs {
					recs[i] = recordstore.Record{Topic: "orders", UUID: "u", Payload: []byte("{}")}
				}
				require.NoError(t, s.Insert(ctx, recs))
			}
			_, many, _, _ := sqlstore.CompletionStatements(s)
			args := []any{[]int64{5, 6, 7, 8}}
			if mode == sqlstore.Mark {
				args = append(args, "handler")
			}
			args = append(args, []string{"u", "u", "", "u"})
			var plan []string
			require.NoError(t, db.SelectContext(ctx, &plan, "EXPLAIN "+many, args...))
			text := strings.Join(plan, "\n")
			assert.Contains(t, text, "_pkey", text)
			assert.NotContains(t, text, "_pending", text)
		})
	}
}

// TestCombinedCheckLooksUpEachDelivery: on PostgreSQL, the combined check
// finds each record by its primary key even in the plan PostgreSQL caches
// for a prepared statement while the table is small (a generic plan),
// which it keeps using as the table grows. As a join of the ids with the
// table, that plan hash-joined a scan of the whole table.
func TestCombinedCheckLooksUpEachDelivery(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := testCtx(t)
	s := testenv.NewStore(t, testenv.Backends()[0], db, sqlstore.Mark)
	require.NoError(t, s.Insert(ctx, []recordstore.Record{{Topic: "orders", UUID: "u", Payload: []byte("{}")}}))
	text := genericPlan(t, db, sqlstore.CheckStatement(s), "bigint[], text[]", "'{1,2,3,4}', '{a,a,a,a}'")
	assert.Contains(t, text, "_pkey", text)
	assert.NotContains(t, text, "Seq Scan", text)
}

// genericPlan is the plan PostgreSQL caches for query as a prepared
// statement while the table is small (a generic plan, which it keeps using
// as the table grows), with arguments of the types given, for args.
func genericPlan(t *testing.T, db *sqlx.DB, query, types, args string) string {
	t.Helper()
	ctx := testCtx(t)
	conn, err := db.Connx(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "PREPARE generic_plan("+types+") AS "+query)
	require.NoError(t, err)
	defer conn.ExecContext(ctx, "DEALLOCATE generic_plan") //nolint:errcheck // the connection is closed next
	var plan []string
	require.NoError(t, conn.SelectContext(ctx, &plan, "EXPLAIN EXECUTE generic_plan("+args+")"))
	return strings.Join(plan, "\n")
}

// TestReplayPageUsesThePendingIndex: on MariaDB, a replay page is read
// through the pending index (topic, processed_at, id). MySQL and MariaDB
// have no partial indexes, and without a hint the optimizer read a page
// half way through a backlog as a ref on processed_at NULL in the processed
// index, walking every pending record before the page: a replay of a
// million records ran at 19,576 rows/s instead of 45,567.
func TestReplayPageUsesThePendingIndex(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[2]
	require.Equal(t, "MariaDB", b.Name)
	db := b.Open(t)
	ctx := testCtx(t)
	s := testenv.NewStore(t, b, db, sqlstore.Mark)
	var last int64
	for range 20 {
		recs := make([]recordstore.Record, 1000)
		for i := range recs {
			recs[i] = recordstore.Record{Topic: "orders", UUID: "u", Payload: []byte("{}")}
		}
		require.NoError(t, s.Insert(ctx, recs))
		last = recs[len(recs)-1].ID
	}
	_, err := db.ExecContext(ctx, "ANALYZE TABLE "+s.Table())
	require.NoError(t, err)
	rows, err := db.QueryxContext(ctx, "EXPLAIN "+sqlstore.PendingAfterStatement(s), "orders", last-10000, 500)
	require.NoError(t, err)
	defer rows.Close()
	require.True(t, rows.Next())
	plan := map[string]any{}
	require.NoError(t, rows.MapScan(plan))
	key, _ := plan["key"].([]byte)
	assert.Equal(t, strings.Trim(s.Table(), "`")+"_pending", string(key), "plan: %v", plan)
}
