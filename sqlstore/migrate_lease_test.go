package sqlstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestMigrateAddsTheLeaseToAFirstReleaseTable upgrades a table created by
// the first release, with a pending record in it, and leases that record.
func TestMigrateAddsTheLeaseToAFirstReleaseTable(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			db := b.Open(t)
			table := testenv.Table(t)
			t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, table) })
			old, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, DB: db})
			require.NoError(t, err)
			sqlstore.UseMigrations(old, firstMigrationOnly(t, b.Dialect))
			require.NoError(t, old.Migrate(testCtx(t)))
			recs := testRecords(1)
			require.NoError(t, old.Insert(testCtx(t), recs))

			leased, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, DB: db, Lease: time.Hour})
			require.NoError(t, err)
			require.ErrorIs(t, leased.Verify(testCtx(t)), sqlstore.ErrSchemaVersion, "the old table lacks the lease column")
			require.NoError(t, leased.Migrate(testCtx(t)))
			require.NoError(t, leased.Verify(testCtx(t)))

			first, second := delivery(recs[0].ID), delivery(recs[0].ID)
			first.Lease, second.Lease = "first", "second"
			require.NoError(t, leased.CheckPending(testCtx(t), first))
			assert.ErrorIs(t, leased.CheckPending(testCtx(t), second), recordstore.ErrLeased)
		})
	}
}
