package sqlstore_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// mysqlDialects are the two ways the MySQL dialect inserts, both run here on
// MariaDB: RETURNING, and the LAST_INSERT_ID() path MySQL 8 takes.
var mysqlDialects = map[string]func() *sqlstore.Dialect{
	"Returning":    sqlstore.MySQL,
	"LastInsertID": sqlstore.MySQLWithoutReturning,
}

// openMySQL opens the test MySQL/MariaDB database with the DSN changed by edit.
func openMySQL(t *testing.T, edit func(cfg *mysqldriver.Config)) *sqlx.DB {
	t.Helper()
	cfg, err := mysqldriver.ParseDSN(testenv.MySQLDSN())
	require.NoError(t, err)
	edit(cfg)
	return testenv.Open(t, "MariaDB", "mysql", cfg.FormatDSN())
}

func mysqlStore(t *testing.T, d *sqlstore.Dialect, db *sqlx.DB) *sqlstore.Store {
	t.Helper()
	return testenv.NewStore(t, testenv.Backend{Name: "MariaDB", Dialect: d}, db, sqlstore.Mark)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// sessionCounters reads how many statements the session has sent, and how
// many it prepared.
func sessionCounters(t *testing.T, db *sqlx.DB) (questions, prepares int64) {
	t.Helper()
	var rows []struct {
		Name  string `db:"Variable_name"`
		Value int64  `db:"Value"`
	}
	require.NoError(t, db.SelectContext(testCtx(t), &rows,
		"SHOW SESSION STATUS WHERE Variable_name IN ('Questions', 'Com_stmt_prepare')"))
	for _, r := range rows {
		switch r.Name {
		case "Questions":
			questions = r.Value
		case "Com_stmt_prepare":
			prepares = r.Value
		}
	}
	return questions, prepares
}

// forEachMySQLDialect runs fn as a parallel subtest per way of inserting,
// each on a pool of its own.
func forEachMySQLDialect(t *testing.T, fn func(t *testing.T, d *sqlstore.Dialect, db *sqlx.DB)) {
	for name, dialect := range mysqlDialects {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, dialect(), testenv.MySQL(t))
		})
	}
}

func TestMySQLBatchIsOneStatement(t *testing.T) {
	t.Parallel()
	forEachMySQLDialect(t, func(t *testing.T, d *sqlstore.Dialect, db *sqlx.DB) {
		db.SetMaxOpenConns(1) // one session, so its counters see every statement
		store := mysqlStore(t, d, db)
		require.NoError(t, store.Insert(testCtx(t), testRecords(1))) // the first use probes the server

		q0, _ := sessionCounters(t, db)
		q1, p1 := sessionCounters(t, db)
		perRead := q1 - q0 // a read of the counters counts itself
		recs := testRecords(100)
		require.NoError(t, store.Insert(testCtx(t), recs))
		q2, p2 := sessionCounters(t, db)

		assert.Equal(t, int64(1), q2-q1-perRead, "100 records are saved with one statement, and the server is not probed again")
		assert.Equal(t, p1, p2, "nothing is prepared: the statement is one round trip")
		assert.Equal(t, recs[0].ID+99, recs[99].ID)
	})
}

func TestMySQLTellsMariaDBFromMySQL(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	var version string
	require.NoError(t, db.GetContext(testCtx(t), &version, "SELECT VERSION()"))
	if !bytes.Contains([]byte(version), []byte("MariaDB")) {
		t.Skipf("the test server is not MariaDB but %s", version)
	}
	returning, err := sqlstore.InsertsWithReturning(testCtx(t), mysqlStore(t, sqlstore.MySQL(), db))
	require.NoError(t, err)
	assert.True(t, returning, "MariaDB %s has INSERT … RETURNING", version)
	returning, err = sqlstore.InsertsWithReturning(testCtx(t), mysqlStore(t, sqlstore.MySQLWithoutReturning(), db))
	require.NoError(t, err)
	assert.False(t, returning)
}

func TestMySQLRefusesPoolsItCannotServe(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		edit func(cfg *mysqldriver.Config)
		says string
	}{
		"WithoutInterpolateParams": {func(cfg *mysqldriver.Config) { cfg.InterpolateParams = false }, "interpolateParams=true"},
		"ThreeByteUTF8":            {func(cfg *mysqldriver.Config) { cfg.Params = map[string]string{"charset": "utf8"} }, "utf8mb4"},
		"NotStrict": {func(cfg *mysqldriver.Config) {
			cfg.Params = map[string]string{"sql_mode": "'NO_ENGINE_SUBSTITUTION'"}
		}, "strict SQL mode"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.MySQL(), Table: testenv.Table(t), DB: openMySQL(t, tc.edit)})
			require.NoError(t, err)
			for op, err := range map[string]error{
				"Migrate": store.Migrate(testCtx(t)),
				"Verify":  store.Verify(testCtx(t)),
				"Insert":  store.Insert(testCtx(t), testRecords(1)),
			} {
				require.ErrorIs(t, err, sqlstore.ErrInvalidConfig, op)
				assert.Contains(t, err.Error(), tc.says, op)
			}
		})
	}
}

func TestMySQLBatchLargerThanAPacket(t *testing.T) {
	t.Parallel()
	forEachMySQLDialect(t, func(t *testing.T, d *sqlstore.Dialect, db *sqlx.DB) {
		// Tens of megabytes go through the driver's escaping and InnoDB's
		// redo log here: on a loaded machine that takes more than the
		// minute other statements get.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		defer cancel()
		var maxPacket int
		require.NoError(t, db.GetContext(ctx, &maxPacket, "SELECT @@max_allowed_packet"))
		store := mysqlStore(t, d, db)
		// Records of a quarter packet each, every byte escaped: one
		// record is half a packet, so each statement holds one.
		recs := testRecords(3)
		for i := range recs {
			recs[i].Payload = bytes.Repeat([]byte{'\'', 0}, maxPacket/8)
			recs[i].Payload[1] = byte('a' + i)
		}
		require.NoError(t, store.Insert(ctx, recs))
		got, err := store.PendingAfter(ctx, "orders", 0, 10)
		require.NoError(t, err)
		require.Len(t, got, len(recs))
		for i := range recs {
			assert.Equal(t, recs[i].ID, got[i].ID)
			assert.True(t, bytes.Equal(recs[i].Payload, got[i].Payload), "record %d", i)
		}

		// A row the table refuses in the last statement: none is saved.
		failing := testRecords(len(recs))
		for i := range failing {
			failing[i].Payload = recs[i].Payload
		}
		failing[len(failing)-1].Topic = string(bytes.Repeat([]byte("t"), 600)) // VARBINARY(512)
		require.Error(t, store.Insert(ctx, failing))
		got, err = store.PendingAfter(ctx, "orders", recs[len(recs)-1].ID, 10)
		require.NoError(t, err)
		assert.Empty(t, got, "the statements of one batch commit together")
	})
}

func testRecords(n int) []recordstore.Record {
	recs := make([]recordstore.Record, n)
	for i := range recs {
		recs[i] = recordstore.Record{Topic: "orders", UUID: "u" + string(rune('a'+i%26)), Payload: []byte("p")}
	}
	return recs
}
