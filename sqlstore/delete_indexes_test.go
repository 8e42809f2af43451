package sqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestDeletingTableHasNoPendingIndex: on PostgreSQL and SQLite a deleting
// table holds only pending and abandoned records, so it keeps no index by
// topic beside its primary key, and an insert writes one index entry
// instead of two. A deleting table of schema version 7 loses the index at
// its upgrade, and its records read back by topic, in order, as before; a
// marking table keeps its index.
func TestDeletingTableHasNoPendingIndex(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		if b.Dialect.Name() == "mysql" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			db := b.Open(t)
			indexes := func(table string) []string {
				t.Helper()
				query := "SELECT indexname FROM pg_indexes WHERE tablename = $1 ORDER BY indexname"
				if b.Dialect.Name() == "sqlite" {
					query = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL ORDER BY name"
				}
				var out []string
				require.NoError(t, db.SelectContext(ctx, &out, query, table))
				return out
			}
			marking := testenv.NewStore(t, b, db, sqlstore.Mark)
			assert.Contains(t, indexes(marking.Table()), marking.Table()+"_pending")

			table := testenv.Table(t)
			s, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: sqlstore.Delete, DB: db})
			require.NoError(t, err)
			t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, table) })
			require.NoError(t, s.MigrateTo(ctx, 7))
			require.Contains(t, indexes(table), table+"_pending", "version 7 has the index")
			recs := []recordstore.Record{
				{Topic: "orders", UUID: "a", Payload: []byte("1")},
				{Topic: "invoices", UUID: "b", Payload: []byte("2")},
				{Topic: "orders", UUID: "c", Payload: []byte("3")},
			}
			require.NoError(t, s.Insert(ctx, recs))

			require.NoError(t, s.Migrate(ctx))
			require.NoError(t, s.Verify(ctx))
			assert.NotContains(t, indexes(table), table+"_pending")
			got, err := s.PendingAfter(ctx, "orders", 0, 10)
			require.NoError(t, err)
			require.Len(t, got, 2)
			assert.Equal(t, []string{"a", "c"}, []string{got[0].UUID, got[1].UUID})
			got, err = s.PendingAfter(ctx, "orders", recs[0].ID, 10)
			require.NoError(t, err)
			require.Len(t, got, 1)
			assert.Equal(t, recs[2].ID, got[0].ID)
		})
	}
}
