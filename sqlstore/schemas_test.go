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

// tenants is one table name in two schemas and in the connection's own.
type tenants struct {
	b        testenv.Backend
	a, other *sqlstore.Store // tenant_a.<table>, tenant_b.<table>
	home     *sqlstore.Store // <table>, unqualified
	schemaA  string
	schemaB  string
	table    string
	mode     sqlstore.Completion
}

// newTenants migrates the table in tenant_a, tenant_b and the connection's
// own schema.
func newTenants(t *testing.T, b testenv.Backend, mode sqlstore.Completion) *tenants {
	t.Helper()
	db := b.Open(t)
	tn := &tenants{b: b, mode: mode, table: testenv.Table(t),
		schemaA: testenv.Schema(t, db, b.Dialect, "tenant_a"), schemaB: testenv.Schema(t, db, b.Dialect, "tenant_b")}
	open := func(table string) *sqlstore.Store {
		s, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: mode, DB: db})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(testCtx(t)))
		t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, table) })
		return s
	}
	tn.a, tn.other, tn.home = open(tn.schemaA+"."+tn.table), open(tn.schemaB+"."+tn.table), open(tn.table)
	return tn
}

// TestSchemasSideBySide runs one table name in two schemas (and unqualified
// in the connection's own): records, identities, versions, status,
// completion, failures and cleaning of one never touch the others.
func TestSchemasSideBySide(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.SchemaBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
				t.Run(mode.String(), func(t *testing.T) {
					t.Parallel()
					testSchemasSideBySide(t, newTenants(t, b, mode))
				})
			}
			t.Run("VersionsAreTheSchemas", func(t *testing.T) {
				t.Parallel()
				testVersionsPerSchema(t, b)
			})
			t.Run("MissingSchemaIsNamedNotCreated", func(t *testing.T) {
				t.Parallel()
				testMissingSchema(t, b)
			})
		})
	}
}

func testSchemasSideBySide(t *testing.T, tn *tenants) {
	ctx := testCtx(t)
	db := tn.a.DB()

	// Identities: one per table, kept in its schema's version table.
	idA, err := tn.a.Identity(ctx)
	require.NoError(t, err)
	idB, err := tn.other.Identity(ctx)
	require.NoError(t, err)
	idHome, err := tn.home.Identity(ctx)
	require.NoError(t, err)
	assert.NotEqual(t, idA, idB, "each schema's table has its own identity")
	assert.NotEqual(t, idA, idHome)
	assert.NotEqual(t, idB, idHome)
	again, err := sqlstore.New(sqlstore.Config{Dialect: tn.b.Dialect, Table: tn.a.Table(), Completion: tn.mode, DB: db})
	require.NoError(t, err)
	got, err := again.Identity(ctx)
	require.NoError(t, err)
	assert.Equal(t, idA, got, "a new store value on tenant_a's table reads tenant_a's identity")
	// The connection's own schema, named, is the unqualified table: one
	// row in one version table, so qualifying a name in use keeps it.
	var own string
	require.NoError(t, db.GetContext(ctx, &own, map[string]string{"postgres": "SELECT current_schema()", "mysql": "SELECT DATABASE()"}[tn.b.Dialect.Name()]))
	named, err := sqlstore.New(sqlstore.Config{Dialect: tn.b.Dialect, Table: own + "." + tn.table, Completion: tn.mode, DB: db})
	require.NoError(t, err)
	require.NoError(t, named.Verify(ctx))
	got, err = named.Identity(ctx)
	require.NoError(t, err)
	assert.Equal(t, idHome, got, "%s.%s is the unqualified table", own, tn.table)
	for _, schema := range []string{tn.schemaA, tn.schemaB} {
		var n int
		require.NoError(t, db.GetContext(ctx, &n, db.Rebind("SELECT COUNT(*) FROM "+schema+"."+sqlstore.VersionTable+" WHERE table_name = ?"), tn.table))
		assert.Equal(t, 1, n, "the row of %s.%s is in %s's version table, keyed by the bare name", schema, tn.table, schema)
	}

	// One record without consumers, one with, one to abandon, in each
	// schema. Fresh tables number from the same start, so the ids
	// coincide: a statement that strayed into the other schema would act
	// on a record there.
	recsA, recsB := tenantRecords(), tenantRecords()
	require.NoError(t, tn.a.Insert(ctx, recsA))
	require.NoError(t, tn.other.Insert(ctx, recsB))
	for i := range recsA {
		require.Equal(t, recsA[i].ID, recsB[i].ID, "fresh tables in two schemas give the same ids")
	}

	require.NoError(t, tn.a.Complete(ctx, orders(recsA[0].ID, "")))
	require.NoError(t, tn.a.Complete(ctx, orders(recsA[1].ID, "billing")))
	_, abandoned, err := tn.a.RecordFailure(ctx, orders(recsA[2].ID, ""), "poison", 1, nil)
	require.NoError(t, err)
	require.True(t, abandoned)

	assert.ErrorIs(t, tn.a.CheckPending(ctx, orders(recsA[0].ID, "")), recordstore.ErrNotPending)
	assert.ErrorIs(t, tn.a.CheckPending(ctx, orders(recsA[1].ID, "billing")), recordstore.ErrNotPending)
	assert.NoError(t, tn.a.CheckPending(ctx, orders(recsA[1].ID, "shipping")))
	for _, d := range []recordstore.Delivery{orders(recsB[0].ID, ""), orders(recsB[1].ID, "billing"), orders(recsB[1].ID, "shipping"), orders(recsB[2].ID, "")} {
		assert.NoError(t, tn.other.CheckPending(ctx, d), "tenant_b's record %d is pending for %q", d.ID, d.Consumer)
	}
	pending, err := tn.other.PendingAfter(ctx, "orders", 0, 10)
	require.NoError(t, err)
	assert.Len(t, pending, 3, "tenant_b's records are all pending")

	// Status counts each schema's own.
	completed := int64(0)
	if tn.mode == sqlstore.Mark {
		completed = 1
	}
	statusA, err := tn.a.Status(ctx)
	require.NoError(t, err)
	require.Len(t, statusA, 1)
	assert.Equal(t, int64(1), statusA[0].Pending, "tenant_a: the record shipping has not completed")
	assert.Equal(t, int64(1), statusA[0].Abandoned)
	assert.Equal(t, completed, statusA[0].Completed)
	statusB, err := tn.other.Status(ctx)
	require.NoError(t, err)
	require.Len(t, statusB, 1)
	assert.Equal(t, int64(3), statusB[0].Pending)
	assert.Zero(t, statusB[0].Abandoned)
	assert.Zero(t, statusB[0].Completed)
	statusHome, err := tn.home.Status(ctx)
	require.NoError(t, err)
	assert.Empty(t, statusHome, "the unqualified table is another table")

	// Cleaning tenant_a cleans only tenant_a's completed records.
	require.NoError(t, tn.other.Complete(ctx, orders(recsB[0].ID, "")))
	if tn.mode == sqlstore.Mark {
		for _, table := range []string{tn.a.Table(), tn.other.Table()} {
			_, err := db.ExecContext(ctx, db.Rebind("UPDATE "+table+" SET processed_at = ? WHERE id = ?"), time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), recsA[0].ID)
			require.NoError(t, err)
		}
	}
	n, err := tn.a.Clean(ctx, time.Hour, 10)
	require.NoError(t, err)
	kept, err := tn.other.Operator().List(ctx, sqlstore.RecordFilter{}, 0, 10, 0)
	require.NoError(t, err)
	assert.Len(t, kept, 2, "tenant_b keeps its pending records")
	if tn.mode == sqlstore.Mark {
		assert.Equal(t, 1, n, "tenant_a's completed record is cleaned")
		_, err = tn.a.Operator().Get(ctx, recsA[0].ID)
		assert.ErrorIs(t, err, sqlstore.ErrRecordNotFound)
		info, err := tn.other.Operator().Get(ctx, recsB[0].ID)
		require.NoError(t, err, "tenant_b's completed record with the same id is kept")
		assert.Equal(t, sqlstore.Completed, info.State)
		n, err = tn.other.Clean(ctx, time.Hour, 10)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "tenant_b's own cleaning cleans it")
	} else {
		assert.Zero(t, n, "a deleting table keeps no completed records")
	}

	// Requeueing tenant_a's abandoned record leaves tenant_b's pending one
	// as it was.
	_, err = tn.a.Requeue(ctx, recsA[2].ID)
	require.NoError(t, err)
	_, err = tn.other.Requeue(ctx, recsB[2].ID)
	assert.ErrorIs(t, err, recordstore.ErrNotAbandoned, "tenant_b's record of that id was never abandoned")
}

// testVersionsPerSchema keeps a table of one name at two schema versions in
// two schemas: each is verified and upgraded on its own.
func testVersionsPerSchema(t *testing.T, b testenv.Backend) {
	ctx := testCtx(t)
	db := b.Open(t)
	table := testenv.Table(t)
	schemaA, schemaB := testenv.Schema(t, db, b.Dialect, "tenant_a"), testenv.Schema(t, db, b.Dialect, "tenant_b")
	current, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: schemaA + "." + table, DB: db})
	require.NoError(t, err)
	older, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: schemaB + "." + table, DB: db})
	require.NoError(t, err)
	require.NoError(t, current.Migrate(ctx))
	require.NoError(t, older.MigrateTo(ctx, 3))
	idA, err := current.Identity(ctx)
	require.NoError(t, err)

	require.NoError(t, current.Verify(ctx))
	err = older.Verify(ctx)
	require.ErrorIs(t, err, sqlstore.ErrSchemaVersion, "tenant_b's table is at version 3")
	assert.Contains(t, err.Error(), schemaB+"."+table)
	_, err = older.Identity(ctx)
	require.ErrorIs(t, err, sqlstore.ErrSchemaVersion, "a version-3 table has no identity, whatever tenant_a's has")

	require.NoError(t, older.Migrate(ctx))
	require.NoError(t, older.Verify(ctx))
	idB, err := older.Identity(ctx)
	require.NoError(t, err)
	assert.NotEqual(t, idA, idB)
	got, err := current.Identity(ctx)
	require.NoError(t, err)
	assert.Equal(t, idA, got, "upgrading tenant_b leaves tenant_a's identity")
}

// testMissingSchema: the store names a missing schema and never creates it.
func testMissingSchema(t *testing.T, b testenv.Backend) {
	ctx := testCtx(t)
	db := b.Open(t)
	schema := "tenant_missing_" + testenv.Table(t)[len(testenv.Table(t))-12:]
	table := schema + ".orders"
	s, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, DB: db})
	require.NoError(t, err)

	for op, err := range map[string]error{
		"Migrate": s.Migrate(ctx),
		"Verify":  s.Verify(ctx),
		"Identity": func() error {
			_, err := s.Identity(ctx)
			return err
		}(),
		"OpenTable": func() error {
			_, err := sqlstore.OpenTable(ctx, db, b.Dialect, table)
			return err
		}(),
	} {
		require.ErrorIs(t, err, sqlstore.ErrSchemaMissing, op)
		assert.NotErrorIs(t, err, sqlstore.ErrTableMissing, "%s: Migrate would not help", op)
		assert.Contains(t, err.Error(), `schema "`+schema+`" does not exist`, op)
		assert.Contains(t, err.Error(), `table "`+table+`"`, op)
	}
	var n int
	q := "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?"
	require.NoError(t, db.GetContext(ctx, &n, db.Rebind(q), schema))
	assert.Zero(t, n, "the store does not create schemas")
}

// tenantRecords are a record without consumers, one with two, and one to
// abandon.
func tenantRecords() []recordstore.Record {
	recs := testRecords(3)
	recs[1].Consumers = []string{"billing", "shipping"}
	return recs
}

// orders is the delivery of record id of "orders" to consumer.
func orders(id int64, consumer string) recordstore.Delivery {
	return recordstore.Delivery{ID: id, Topic: "orders", Consumer: consumer}
}
