// Package storetest is the contract suite of the sqlstore stores: what every
// [recordstore.Store] must do, and what sqlstore adds (migrations, table names,
// Verify). It runs against a real database; sqlstore runs it for PostgreSQL,
// MySQL/MariaDB and SQLite.
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
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

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
// cfg.Table to a fresh lowercase identifier and cfg.Completion.
type NewStore func(t *testing.T, cfg sqlstore.Config) *sqlstore.Store

// Run runs the whole suite, each test on its own fresh table, in parallel.
func Run(t *testing.T, f Features, newStore NewStore) {
	require.NoError(t, f.Validate())
	s := &suite{f: f, newStore: newStore}
	t.Run("Insert", s.testInsert)
	t.Run("CheckPending", s.testCheckPending)
	t.Run("Complete", s.testComplete)
	t.Run("PendingAfter", s.testPendingAfter)
	t.Run("RoundTrip", s.testRoundTrip)
	t.Run("Schema", s.testSchema)
	t.Run("InsertTx", s.testInsertTx)
	t.Run("CompleteTx", s.testCompleteTx)
	t.Run("Lease", s.testLease)
	t.Run("Attempts", s.testAttempts)
	t.Run("ClaimStale", s.testClaimStale)
	t.Run("Purge", s.testPurge)
	t.Run("Status", s.testStatus)
	t.Run("Admin", s.testAdmin)
	t.Run("Identity", s.testIdentity)
	t.Run("UpgradeFromVersion3", s.testUpgrade)
	t.Run("Topic", s.testTopic)
	t.Run("OneReceiver", s.testOneReceiver)
	t.Run("Consumers", s.testConsumers)
	t.Run("ConsumerLease", s.testConsumerLease)
	t.Run("ConsumerAttempts", s.testConsumerAttempts)
	t.Run("Retry", s.testRetry)
	t.Run("ConsumerStatus", s.testConsumerStatus)
}

type suite struct {
	f        Features
	newStore NewStore
}

// modes are the completion modes every contract test runs in.
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

func modeName(m sqlstore.Completion) string {
	if m == sqlstore.Mark {
		return "Mark"
	}
	return "Delete"
}

// bare returns a store whose table does not exist yet.
func (s *suite) bare(t *testing.T, mode sqlstore.Completion) *sqlstore.Store {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	store := s.newStore(t, sqlstore.Config{Table: "storetest_" + hex.EncodeToString(b[:]), Completion: mode})
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

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// records builds n records of the topic with distinct UUIDs.
func records(topic string, n int) []recordstore.Record {
	out := make([]recordstore.Record, n)
	for i := range out {
		var b [8]byte
		_, _ = rand.Read(b[:])
		u := hex.EncodeToString(b[:])
		out[i] = recordstore.Record{Topic: topic, UUID: u, Payload: []byte("payload " + u), Metadata: map[string]string{"n": fmt.Sprint(i)}}
	}
	return out
}

// insert saves records in one call and returns them with their ids.
func insert(t *testing.T, store *sqlstore.Store, recs []recordstore.Record) []recordstore.Record {
	t.Helper()
	require.NoError(t, store.Insert(ctx(t), recs))
	return recs
}

// rowIDs reads id and uuid of every row, straight from the table.
func rowIDs(t *testing.T, store *sqlstore.Store) map[string]int64 {
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

func rowCount(t *testing.T, store *sqlstore.Store) int {
	t.Helper()
	var n int
	require.NoError(t, store.DB().GetContext(ctx(t), &n, "SELECT COUNT(*) FROM "+store.Table()))
	return n
}

// consumer is the handler name the tests of records without consumers
// complete them as.
const consumer = "handler"

// dlv is the delivery of record id of topic "orders" to consumer.
func dlv(id int64) recordstore.Delivery {
	return recordstore.Delivery{ID: id, Topic: "orders", Consumer: consumer}
}
