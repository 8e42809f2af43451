package main

import (
	"encoding/json"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestTableInSchema operates a schema-qualified table (-table schema.table)
// beside a table of the same name in the connection's own schema, which no
// command touches.
func TestTableInSchema(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.SchemaBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			var home *sqlstore.Store
			f := newFixtureOn(t, b, func(db *sqlx.DB) *sqlstore.Store {
				schema := testenv.Schema(t, db, b.Dialect, "tenant_a")
				home = testenv.NewStore(t, b, db, sqlstore.Mark)
				s, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: schema + "." + home.Table(), Completion: sqlstore.Mark, DB: db})
				require.NoError(t, err)
				require.NoError(t, s.Migrate(t.Context()))
				t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, s.Table()) })
				return s
			})
			require.NoError(t, home.Insert(t.Context(), []recordstore.Record{{Topic: "orders", UUID: "home", Payload: []byte("{}")}}))

			r := f.ctl(t, "-json", "status")
			require.Zero(t, r.code, r.stderr)
			var status statusJSON
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &status), r.stdout)
			assert.Equal(t, f.store.Table(), status.Table)
			require.Len(t, status.Topics, 1)
			assert.Equal(t, recordstore.TopicStatus{Topic: "orders", Pending: 2, OldestPending: status.Topics[0].OldestPending, Abandoned: 1, Completed: 1, Unchecked: 2}, status.Topics[0])

			r = f.ctl(t, "show", f.id(1))
			require.Zero(t, r.code, r.stderr)
			assert.Contains(t, r.stdout, "uuid:       uuid-1\nstate:      abandoned\n")

			r = f.ctl(t, "requeue", f.id(1))
			require.Zero(t, r.code, r.stderr)
			require.NoError(t, f.store.CheckPending(t.Context(), delivery(f.recs[1].ID)))

			_, err := f.store.DB().ExecContext(t.Context(), "UPDATE "+f.store.Table()+" SET processed_at = '2000-01-01 00:00:00' WHERE processed_at IS NOT NULL")
			require.NoError(t, err)
			r = f.ctl(t, "-json", "clean", "-older-than", "1h")
			require.Zero(t, r.code, r.stderr)
			assert.JSONEq(t, `{"deleted": 1}`, r.stdout)

			r = outboxctl(t, "", nil, "-dsn", f.dsn, "-table", home.Table(), "-json", "status")
			require.Zero(t, r.code, r.stderr)
			status = statusJSON{}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &status), r.stdout)
			require.Len(t, status.Topics, 1)
			assert.Equal(t, int64(1), status.Topics[0].Pending, "the unqualified table of the same name keeps its record")
			assert.Zero(t, status.Topics[0].Abandoned+status.Topics[0].Completed)

			missing := "tenant_missing_" + f.store.Table()[len(f.store.Table())-12:] + ".orders"
			r = outboxctl(t, "", nil, "-dsn", f.dsn, "-table", missing, "status")
			assert.Equal(t, 1, r.code)
			assert.Contains(t, r.stderr, `schema "`+missing[:len(missing)-len(".orders")]+`" does not exist`)
			assert.NotContains(t, r.stderr, "Store.Migrate", "migrating would not help")

			for _, bad := range []string{"a.b.c", ".orders", "tenant.", "tenant .orders", `"tenant".orders`} {
				r = outboxctl(t, "", nil, "-dsn", f.dsn, "-table", bad, "status")
				assert.Equal(t, 2, r.code, "a bad -table is a usage error: %s", bad)
				assert.Contains(t, r.stderr, "invalid table name", bad)
				assert.Contains(t, r.stderr, "-table: ", bad)
			}
		})
	}
}

// TestSQLiteRefusesATableInSchema: SQLite tables have no schema.
func TestSQLiteRefusesATableInSchema(t *testing.T) {
	t.Parallel()
	var sqlite testenv.Backend
	for _, b := range testenv.Backends() {
		if b.Dialect.Name() == "sqlite" {
			sqlite = b
		}
	}
	f := newFixture(t, sqlite)
	r := outboxctl(t, "", nil, "-dsn", f.dsn, "-table", "tenant_a."+f.store.Table(), "status")
	assert.Equal(t, 2, r.code, "a usage error")
	assert.Contains(t, r.stderr, "invalid table name")
	assert.Contains(t, r.stderr, "sqlite")
}

// TestBadTableIsAUsageError: the table name is checked before connecting,
// so a typo is reported as one even when the database is out of reach.
func TestBadTableIsAUsageError(t *testing.T) {
	t.Parallel()
	r := outboxctl(t, "", nil, "-dsn", "postgres://app@127.0.0.1:1/test?sslmode=disable", "-table", "orders;drop", "status")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "-table: sqlstore: invalid table name")
	assert.NotContains(t, r.stderr, "cannot connect")
}
