package sqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
	"github.com/wmoutbox/outbox/sqlstore/storetest"
)

// contractBackends are the databases the contract suite runs on: every
// backend, plus MariaDB again on the LAST_INSERT_ID() path that MySQL 8 takes.
func contractBackends() []testenv.Backend {
	bs := testenv.Backends()
	for _, b := range bs {
		if b.Name == "MariaDB" {
			b.Name, b.Dialect = "MariaDBLastInsertID", sqlstore.MySQLWithoutReturning()
			bs = append(bs, b)
			break
		}
	}
	return bs
}

func TestStoreContract(t *testing.T) {
	t.Parallel()
	for _, b := range contractBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, b.Features, func(t *testing.T, cfg sqlstore.Config) *sqlstore.Store {
				db := b.Open(t) // a fresh pool; on SQLite a fresh file
				cfg.Dialect, cfg.DB = b.Dialect, db
				s, err := sqlstore.New(cfg)
				require.NoError(t, err)
				t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, cfg.Table) })
				return s
			})
		})
	}
}

// TestStoreContractInSchema runs the whole suite on tables qualified by a
// schema that is not the connection's own (on MariaDB, another database):
// every statement, migration, index, the consumers table and the schema
// version row must live there.
func TestStoreContractInSchema(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.SchemaBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			schema := testenv.Schema(t, b.Open(t), b.Dialect, "storetest")
			storetest.Run(t, b.Features, func(t *testing.T, cfg sqlstore.Config) *sqlstore.Store {
				db := b.Open(t)
				cfg.Dialect, cfg.DB, cfg.Table = b.Dialect, db, schema+"."+cfg.Table
				s, err := sqlstore.New(cfg)
				require.NoError(t, err)
				t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, cfg.Table) })
				return s
			})
		})
	}
}
