package storetest

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/sqlstore"
)

// badTableNames are names that are neither plain identifiers nor two of
// them joined by one dot (schema.table), which every dialect refuses.
var badTableNames = []string{
	"1orders", `orders"; DROP TABLE x; --`, "orders`x", "orders'x", "a b", "a-b", "a;b",
	"ordres_é", "orders\x00", "ab\ncd", "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghij",
	"a.b.c", ".orders", "tenant.", ".", "a..b", "tenant .orders", "tenant. orders", `"tenant".orders`,
	"`tenant`.orders", "tenant.'orders'", "1tenant.orders", "tenant.1orders", "tenant.orders;x",
	"tenant.abcdefghijabcdefghijabcdefghijabcdefghijabcdefghij",
}

func (s *suite) testSchema(t *testing.T) {
	t.Run("BadTableNamesAreRefusedBeforeSQL", func(t *testing.T) {
		t.Parallel()
		store := s.bare(t, sqlstore.Mark)
		// New refuses the name, so there is no store whose methods could
		// run SQL with it; New itself runs none.
		for _, name := range badTableNames {
			bad, err := sqlstore.New(sqlstore.Config{Dialect: store.Dialect(), Table: name, DB: store.DB()})
			assert.ErrorIs(t, err, sqlstore.ErrInvalidTable, "table name %q", name)
			assert.Nil(t, bad, "table name %q", name)
		}
	})

	t.Run("MigrateIsIdempotent", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			rec := insert(t, store, records("orders", 1))[0]
			require.NoError(t, store.Migrate(ctx(t)))
			require.NoError(t, store.Migrate(ctx(t)))
			require.NoError(t, store.Verify(ctx(t)))
			assert.NoError(t, store.CheckPending(ctx(t), dlv(rec.ID)), "migrating again keeps the records")
			assert.Equal(t, s.version(t, store), schemaVersion(t, store))
		})
	})

	t.Run("ConcurrentMigrateCreatesOnce", func(t *testing.T) {
		if !s.f.ConcurrentMigrate {
			t.Skip("the database does not support concurrent migrations (Features.ConcurrentMigrate)")
		}
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.bare(t, mode)
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				wg.Go(func() { errs[i] = store.Migrate(ctx(t)) })
			}
			wg.Wait()
			for i, err := range errs {
				assert.NoError(t, err, "migration %d", i)
			}
			require.NoError(t, store.Verify(ctx(t)))
			insert(t, store, records("orders", 1))
		})
	})

	t.Run("MissingTableNamesTableAndRemedy", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.bare(t, mode)
			err := store.Verify(ctx(t))
			require.ErrorIs(t, err, sqlstore.ErrTableMissing)
			assert.Contains(t, err.Error(), store.Table())
			assert.Contains(t, err.Error(), "Store.Migrate")
		})
	})

	t.Run("NewerSchemaVersionIsRefused", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			newer := schemaVersion(t, store) + 1
			versions, key := versionRow(store)
			_, err := store.DB().ExecContext(ctx(t), store.DB().Rebind("UPDATE "+versions+" SET version = ? WHERE table_name = ?"),
				newer, key)
			require.NoError(t, err)
			for op, err := range map[string]error{"Verify": store.Verify(ctx(t)), "Migrate": store.Migrate(ctx(t))} {
				require.ErrorIs(t, err, sqlstore.ErrSchemaVersion, op)
				assert.Contains(t, err.Error(), store.Table(), op)
				assert.Contains(t, err.Error(), fmt.Sprintf("version %d, newer", newer), op)
			}
			assert.Equal(t, newer, s.version(t, store), "Migrate leaves a newer table alone")
		})
	})

	t.Run("CompletionModeMismatchIsRefused", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			other := sqlstore.Mark
			if mode == sqlstore.Mark {
				other = sqlstore.Delete
			}
			wrong, err := sqlstore.New(sqlstore.Config{Dialect: store.Dialect(), Table: store.Table(), Completion: other, DB: store.DB()})
			require.NoError(t, err)
			for op, err := range map[string]error{"Verify": wrong.Verify(ctx(t)), "Migrate": wrong.Migrate(ctx(t))} {
				require.ErrorIs(t, err, sqlstore.ErrSchemaVersion, op)
				assert.Contains(t, err.Error(), store.Table(), op)
				assert.Contains(t, err.Error(), fmt.Sprintf("created for completion %q", mode), op)
			}
			assert.NoError(t, store.Verify(ctx(t)), "the table is unchanged")
		})
	})
}

// version reads the table's row in the schema version table.
func (s *suite) version(t *testing.T, store *sqlstore.Store) int {
	t.Helper()
	var v int
	versions, key := versionRow(store)
	require.NoError(t, store.DB().GetContext(ctx(t), &v,
		store.DB().Rebind("SELECT version FROM "+versions+" WHERE table_name = ?"), key))
	return v
}

// versionRow returns the schema version table that holds the store's row,
// and the row's key: the version table of the table's schema, keyed by the
// table's name without the schema.
func versionRow(store *sqlstore.Store) (versionTable, key string) {
	if schema, name, ok := strings.Cut(store.Table(), "."); ok {
		return schema + "." + sqlstore.VersionTable, name
	}
	return sqlstore.VersionTable, store.Table()
}

func schemaVersion(t *testing.T, store *sqlstore.Store) int {
	t.Helper()
	v, err := sqlstore.SchemaVersion(store.Dialect())
	require.NoError(t, err)
	return v
}
