package sqlstore_test

import (
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestSQLiteKeepsItsStatementsPrepared: on SQLite the ordered check is
// prepared once per pool and then reused, and the unordered one runs as it
// is; a new pool starts again; the other databases parse on the server and
// prepare nothing.
func TestSQLiteKeepsItsStatementsPrepared(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		open := b.Open
		if b.Name == "SQLite" { // a second pool on the same file
			dsn := testenv.SQLiteDSN(t)
			open = func(tb testing.TB) *sqlx.DB { return testenv.Open(tb, "SQLite", "sqlite", dsn) }
		}
		store := testenv.NewStore(t, b, open(t), sqlstore.Mark)
		recs := []recordstore.Record{
			{Topic: "orders", UUID: "u1", Payload: []byte("{}")},
			{Topic: "orders", UUID: "u2", Payload: []byte("{}"), OrderKey: "k"},
			{Topic: "orders", UUID: "u3", Payload: []byte("{}"), OrderKey: "k"},
		}
		require.NoError(t, store.Insert(ctx, recs))
		check := func() {
			t.Helper()
			require.NoError(t, store.CheckPending(ctx, recordstore.Delivery{ID: recs[0].ID, Topic: "orders", UUID: "u1"}))
			require.NoError(t, store.CheckPending(ctx, recordstore.Delivery{ID: recs[1].ID, Topic: "orders", UUID: "u2", Ordered: true}))
			require.ErrorIs(t, store.CheckPending(ctx, recordstore.Delivery{ID: recs[2].ID, Topic: "orders", UUID: "u3", Ordered: true}),
				recordstore.ErrHeld, "record 3 is held by record 2, through the prepared statement too")
		}
		check()
		after := sqlstore.Prepared(store)
		for range 5 {
			check()
		}
		if b.Name != "SQLite" {
			assert.Zero(t, after, "nothing is prepared on %s", b.Name)
			return
		}
		assert.Equal(t, 1, after, "the ordered check is prepared, the unordered one is not")
		assert.Equal(t, after, sqlstore.Prepared(store), "checking again prepares nothing new")

		store.Attach(open(t))
		assert.Zero(t, sqlstore.Prepared(store), "a new pool has statements of its own")
		check()
		assert.Equal(t, after, sqlstore.Prepared(store))
	})
}
