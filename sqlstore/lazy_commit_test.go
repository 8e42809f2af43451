package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestLazyCommit checks, on PostgreSQL, which of the completion statements
// turn synchronous_commit off for their transaction: the ones the store
// runs on its own do, unless Config.DurableCompletion; the one that runs in
// the caller's transaction (CompleteTx) never does, so the caller's own
// writes keep waiting for the disk. Each statement runs in a transaction
// that is rolled back, and the setting is read inside it.
func TestLazyCommit(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
		for _, durable := range []bool{false, true} {
			name := map[sqlstore.Completion]string{sqlstore.Mark: "Mark", sqlstore.Delete: "Delete"}[mode]
			if durable {
				name += "/DurableCompletion"
			}
			t.Run(name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				table := testenv.Table(t)
				s, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres(), Table: table, Completion: mode, DB: db, DurableCompletion: durable})
				require.NoError(t, err)
				require.NoError(t, s.Migrate(ctx))
				t.Cleanup(func() { testenv.DropTable(t, db, sqlstore.Postgres(), table) })
				recs := []recordstore.Record{{Topic: "orders", UUID: "a", Payload: []byte("{}")}, {Topic: "orders", UUID: "b", Payload: []byte("{}"), Consumers: []string{"email", "stats"}},
					{Topic: "orders", UUID: "a", Payload: []byte("{}")}}
				require.NoError(t, s.Insert(ctx, recs))
				// The combined completion has a record of its own: it takes
				// no row that a transaction wrote, even one rolled back.
				id, withConsumers, manyID := recs[0].ID, recs[1].ID, recs[2].ID

				alone, many, lockAlone, inTx := sqlstore.CompletionStatements(s)
				idArgs := []any{id, "a", "a"}
				if mode == sqlstore.Mark {
					idArgs = []any{"consumer", id, "a", "a"}
				}
				manyArgs := []any{[]int64{manyID}}
				if mode == sqlstore.Mark {
					manyArgs = append(manyArgs, "consumer")
				}
				manyArgs = append(manyArgs, []string{"a"})
				want := "off"
				if durable {
					want = "on"
				}
				assert.Equal(t, want, settingAfter(ctx, t, db, alone, idArgs...), "single completion")
				assert.Equal(t, want, settingAfter(ctx, t, db, many, manyArgs...), "combined completion")
				assert.Equal(t, want, settingAfter(ctx, t, db, lockAlone, withConsumers), "lock of a record with consumers, in the store's own transaction")
				assert.Equal(t, "on", settingAfter(ctx, t, db, inTx, idArgs...), "completion in the caller's transaction")

				// The record is completed all the same, and CompleteTx
				// leaves the caller's transaction as it was.
				tx, err := db.BeginTxx(ctx, nil)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback() }()
				require.NoError(t, s.CompleteTx(ctx, tx, recordstore.Delivery{ID: id, Topic: "orders", Consumer: "consumer"}))
				var setting string
				require.NoError(t, tx.GetContext(ctx, &setting, "SELECT current_setting('synchronous_commit')"))
				assert.Equal(t, "on", setting)
				require.NoError(t, tx.Rollback())
				require.NoError(t, s.Complete(ctx, recordstore.Delivery{ID: id, Topic: "orders", Consumer: "consumer"}))
				assert.ErrorIs(t, s.CheckPending(ctx, recordstore.Delivery{ID: id, Topic: "orders", Consumer: "consumer"}), recordstore.ErrNotPending)
			})
		}
	}
}

// settingAfter runs stmt in a transaction, reads synchronous_commit there
// and rolls back.
func settingAfter(ctx context.Context, t *testing.T, db *sqlx.DB, stmt string, args ...any) string {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, stmt, args...)
	require.NoError(t, err, stmt)
	require.NoError(t, rows.Close())
	var setting string
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT current_setting('synchronous_commit')").Scan(&setting))
	return setting
}
