// Package storetest is the contract suite of the record stores.
//
// [RunContract] tests what every [recordstore.Store] must do, as the
// recordstore package documents it, through the recordstore interfaces and
// an [Inspector] that looks behind them. Any store runs it; the in-memory
// store of the outboxtest package does:
//
//	func TestContract(t *testing.T) {
//		storetest.RunContract(t, storetest.Contract{
//			New: func(t *testing.T, opts storetest.StoreOptions) recordstore.Store {
//				return newStore(t, opts.Completion == storetest.Delete, opts.Lease)
//			},
//			Inspector: inspector{},
//		})
//	}
//
// [RunInbox] is the contract suite of a [recordstore.Inbox], run the same way
// against sqlstore's Inbox on every database and outboxtest's in-memory one.
//
// [Run] is the suite of the sqlstore stores: the contract, and what only a
// SQL store has (migrations, table names, schema versions, the upgrade from
// an older schema, the operator's queries, InsertTx and CompleteTx, the
// database clock). It runs against a real database; sqlstore runs it for
// PostgreSQL, MySQL/MariaDB and SQLite:
//
//	func TestStoreContract(t *testing.T) {
//		storetest.Run(t, storetest.Features{Now: ..., ProcessedAt: ...},
//			func(t *testing.T, cfg sqlstore.Config) *sqlstore.Store {
//				cfg.Dialect, cfg.DB = sqlstore.Postgres(), db
//				s, err := sqlstore.New(cfg)
//				if err != nil {
//					t.Fatal(err)
//				}
//				t.Cleanup(func() { dropTable(db, cfg.Table) })
//				return s
//			})
//	}
package storetest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// Features says what the suite needs to know about a database beyond what
// the store tells it.
type Features struct {
	// Now is a query returning the database clock as text that sorts as
	// time does and compares with what ProcessedAt returns. Required.
	Now string
	// ProcessedAt returns a query, with one ? placeholder for the record id,
	// that reads processed_at of the table as text in Now's format.
	// Required.
	ProcessedAt func(table string) string
	// ConcurrentMigrate is true when Migrate may run from several
	// connections at once, as on PostgreSQL and MySQL/MariaDB. Defaults to
	// false: SQLite can refuse a second writer that started reading first.
	ConcurrentMigrate bool
}

// Validate reports a Features value the suite cannot run with.
func (f Features) Validate() error {
	if f.Now == "" || f.ProcessedAt == nil {
		return fmt.Errorf("storetest: Features.Now and Features.ProcessedAt are required")
	}
	return nil
}

// NewStore returns a store for cfg, with cfg.Dialect and cfg.DB filled in and
// nothing else changed, without creating its table, and drops the table
// (and its row in [sqlstore.VersionTable]) when the test ends. The suite sets
// cfg.Table to a fresh lowercase identifier, cfg.Completion, and cfg.Lease
// for the lease tests. To run the suite in a schema, NewStore may qualify
// the name with it (schema + "." + cfg.Table); the suite then finds the
// table's row in that schema's version table.
type NewStore func(t *testing.T, cfg sqlstore.Config) *sqlstore.Store

// Run runs the whole suite, each test on its own fresh table, in parallel:
// the store contract ([RunContract]) on sqlstore's stores, under
// "Contract", and what only a SQL store has (migrations, table names,
// schema versions, the identity kept in the version table, the upgrade
// from schema version 3, the operator's queries, InsertTx and CompleteTx,
// the database clock).
func Run(t *testing.T, f Features, newStore NewStore) {
	require.NoError(t, f.Validate())
	in := sqlInspector{f: f}
	s := &suite{f: f, newStore: newStore, c: &contract{in: in}}
	t.Run("Contract", func(t *testing.T) {
		RunContract(t, Contract{New: s.contractStore, Inspector: in})
	})
	t.Run("Insert", s.testInsert)
	t.Run("Schema", s.testSchema)
	t.Run("InsertTx", s.testInsertTx)
	t.Run("InsertTxOrigin", s.testInsertTxOrigin)
	t.Run("CompleteTx", s.testCompleteTx)
	t.Run("CompleteTxOfAnotherMessage", s.testCompleteTxOfAnotherMessage)
	t.Run("Attempts", s.testAttempts)
	t.Run("ClaimStale", s.testClaimStale)
	t.Run("Operator", s.testOperator)
	t.Run("Identity", s.testIdentity)
	t.Run("UpgradeFromVersion3", s.testUpgrade)
	t.Run("Consumers", s.testConsumers)
}

type suite struct {
	f        Features
	newStore NewStore
	// c lends the SQL tests the contract's checks.
	c *contract
}

// modes are the completion modes every SQL test runs in.
var modes = []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete}

// forEachMode runs fn as a parallel subtest per completion mode.
func forEachMode(t *testing.T, fn func(t *testing.T, mode sqlstore.Completion)) {
	for _, mode := range modes {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			fn(t, mode)
		})
	}
}

// contractStore is [Contract.New] for sqlstore: a store on a fresh,
// migrated table.
func (s *suite) contractStore(t *testing.T, opts StoreOptions) recordstore.Store {
	t.Helper()
	mode := sqlstore.Mark
	if opts.Completion == Delete {
		mode = sqlstore.Delete
	}
	store := s.newStore(t, sqlstore.Config{Table: tableName(), Completion: mode, Lease: opts.Lease})
	require.NotNil(t, store.DB(), "NewStore must attach the pool")
	require.NoError(t, store.Migrate(ctx(t)))
	return store
}

// tableName is a fresh lowercase table name.
func tableName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "storetest_" + hex.EncodeToString(b[:])
}

// bare returns a store whose table does not exist yet.
func (s *suite) bare(t *testing.T, mode sqlstore.Completion) *sqlstore.Store {
	t.Helper()
	store := s.newStore(t, sqlstore.Config{Table: tableName(), Completion: mode})
	require.NotNil(t, store.DB(), "NewStore must attach the pool")
	return store
}

// store returns a store on a fresh, migrated table.
func (s *suite) store(t *testing.T, mode sqlstore.Completion) *sqlstore.Store {
	t.Helper()
	store := s.bare(t, mode)
	require.NoError(t, store.Migrate(ctx(t)))
	return store
}

// rowIDs reads id and uuid of every row, straight from the table.
func rowIDs(t testing.TB, store *sqlstore.Store) map[string]int64 {
	t.Helper()
	var rows []struct {
		ID   int64  `db:"id"`
		UUID string `db:"uuid"`
	}
	require.NoError(t, store.DB().SelectContext(ctx(t), &rows, "SELECT id, uuid FROM "+store.Table()))
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.UUID] = r.ID
	}
	return out
}

func rowCount(t testing.TB, store *sqlstore.Store) int {
	t.Helper()
	var n int
	require.NoError(t, store.DB().GetContext(ctx(t), &n, "SELECT COUNT(*) FROM "+store.Table()))
	return n
}
