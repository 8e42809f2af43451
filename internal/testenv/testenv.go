// Package testenv connects the project's tests to the real databases they run
// against, with an isolated table per test.
//
// DSNs come from the environment, with the local defaults:
//
//	OUTBOX_TEST_POSTGRES_DSN  postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	OUTBOX_TEST_MYSQL_DSN     root@tcp(127.0.0.1:3306)/test?interpolateParams=true
//
// A database that cannot be reached skips the test with a message naming it,
// except when CI=true, where it fails the test.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // MySQL/MariaDB driver
	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL driver
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // SQLite driver

	"github.com/wmoutbox/outbox/sqlstore"
	"github.com/wmoutbox/outbox/sqlstore/storetest"
)

// Default DSNs of the local services.
const (
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	// DefaultMySQLDSN sets interpolateParams, which the MySQL dialect
	// requires.
	DefaultMySQLDSN = "root@tcp(127.0.0.1:3306)/test?interpolateParams=true"
)

// PostgresDSN returns the PostgreSQL DSN tests use.
func PostgresDSN() string { return env("OUTBOX_TEST_POSTGRES_DSN", DefaultPostgresDSN) }

// MySQLDSN returns the MySQL/MariaDB DSN tests use.
func MySQLDSN() string { return env("OUTBOX_TEST_MYSQL_DSN", DefaultMySQLDSN) }

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Unavailable skips the test, or fails it under CI=true, because a service
// cannot be had.
func Unavailable(tb testing.TB, service string, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s is required under CI=true but not reachable: %v", service, err)
	}
	tb.Skipf("%s not reachable, skipping (set CI=true to fail instead): %v", service, err)
}

// Open opens and pings a database, closing it when the test ends.
func Open(tb testing.TB, service, driver, dsn string) *sqlx.DB {
	tb.Helper()
	db, err := sqlx.Open(driver, dsn)
	if err != nil {
		tb.Fatalf("open %s: %v", service, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		Unavailable(tb, service, err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// Postgres opens the test PostgreSQL database. The pool keeps its
// connections: database/sql keeps only two idle by default, and a service
// under concurrent load would otherwise open a server process per query.
func Postgres(tb testing.TB) *sqlx.DB {
	db := Open(tb, "PostgreSQL", "pgx", PostgresDSN())
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	return db
}

// MySQL opens the test MySQL/MariaDB database.
func MySQL(tb testing.TB) *sqlx.DB {
	db := Open(tb, "MariaDB", "mysql", MySQLDSN())
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	return db
}

// SQLiteDSN returns the DSN of a fresh SQLite file in the test's temp dir.
func SQLiteDSN(tb testing.TB) string {
	path := filepath.Join(tb.TempDir(), "outbox.db")
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"
}

// SQLite opens a fresh SQLite file database with one connection, as the
// sqlstore documentation recommends: SQLite has one writer at a time, and
// queueing in the pool beats contending for the file lock.
func SQLite(tb testing.TB) *sqlx.DB {
	db := Open(tb, "SQLite", "sqlite", SQLiteDSN(tb))
	db.SetMaxOpenConns(1)
	return db
}

// Table returns a table name unique to this test run.
func Table(tb testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.ToLower(tb.Name())
	var clean strings.Builder
	for _, c := range name {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') {
			clean.WriteRune(c)
		}
	}
	s := clean.String()
	if len(s) > 20 {
		s = s[len(s)-20:]
	}
	return "t_" + s + "_" + hex.EncodeToString(b[:])
}

// Backend is one database the suites run against.
type Backend struct {
	Name    string
	Dialect *sqlstore.Dialect
	// Open opens the database (skipping or failing if it is unreachable).
	Open func(tb testing.TB) *sqlx.DB
	// Now is a query returning the database clock, comparable with
	// processed_at.
	Now string
	// Features tells the store contract suite, and the tests that read the
	// clock as text, about the database.
	Features storetest.Features
}

// Backends returns every database the project supports.
func Backends() []Backend {
	return []Backend{
		{Name: "Postgres", Dialect: sqlstore.Postgres(), Open: Postgres, Now: "SELECT now()", Features: storetest.Features{
			Now: "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
			ProcessedAt: func(table string) string {
				return "SELECT to_char(processed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') FROM " + table + " WHERE id = ?"
			},
			ConcurrentMigrate: true,
		}},
		{Name: "SQLite", Dialect: sqlstore.SQLite(), Open: SQLite, Now: sqliteNow, Features: storetest.Features{
			Now:         sqliteNow,
			ProcessedAt: func(table string) string { return "SELECT processed_at FROM " + table + " WHERE id = ?" },
		}},
		{Name: "MariaDB", Dialect: sqlstore.MySQL(), Open: MySQL, Now: mysqlNow, Features: MySQLFeatures},
	}
}

const (
	sqliteNow = "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"
	mysqlNow  = "SELECT DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%d %H:%i:%s.%f')"
)

// MySQLFeatures describes MySQL and MariaDB to the store contract suite.
var MySQLFeatures = storetest.Features{
	Now: mysqlNow,
	ProcessedAt: func(table string) string {
		return "SELECT DATE_FORMAT(processed_at, '%Y-%m-%d %H:%i:%s.%f') FROM " + table + " WHERE id = ?"
	},
	ConcurrentMigrate: true,
}

// NewStore creates a store on a fresh table of the backend, migrated and
// dropped when the test ends.
func NewStore(tb testing.TB, b Backend, db *sqlx.DB, mode sqlstore.Completion) *sqlstore.Store {
	tb.Helper()
	table := Table(tb)
	s, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: mode, DB: db})
	if err != nil {
		tb.Fatalf("new store: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		tb.Fatalf("migrate %s: %v", table, err)
	}
	tb.Cleanup(func() { DropTable(tb, db, b.Dialect, table) })
	return s
}

// DropTable removes a test table, the other tables of its store (the seen
// table also by its name before migration 10, for a table left at an older
// version) and its schema version row. A schema-qualified table's row is
// in its schema's version table, keyed by the name without the schema.
func DropTable(tb testing.TB, db *sqlx.DB, d *sqlstore.Dialect, table string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table) // table names here are generated identifiers
	_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table+"_consumers")
	_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table+"_seen")
	_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table+"_receivers")
	_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table+"_declared")
	versions, key := VersionRow(table)
	_, _ = db.ExecContext(ctx, db.Rebind("DELETE FROM "+versions+" WHERE table_name = ?"), key)
}

// VersionRow returns the schema version table that holds a table's row, and
// the row's key: the version table of the table's schema, keyed by the
// table's name without the schema.
func VersionRow(table string) (versionTable, key string) {
	if schema, name, ok := strings.Cut(table, "."); ok {
		return schema + "." + sqlstore.VersionTable, name
	}
	return sqlstore.VersionTable, table
}

// Schema creates a schema unique to this test run, named prefix_<random>
// (on MySQL/MariaDB a database), and drops it with everything in it when
// the test ends. It fails the test on a database without schemas.
func Schema(tb testing.TB, db *sqlx.DB, d *sqlstore.Dialect, prefix string) string {
	tb.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := prefix + "_" + hex.EncodeToString(b[:])
	var create, drop string
	switch d.Name() {
	case "postgres":
		create, drop = "CREATE SCHEMA IF NOT EXISTS "+name, "DROP SCHEMA IF EXISTS "+name+" CASCADE"
	case "mysql":
		create, drop = "CREATE DATABASE IF NOT EXISTS "+name, "DROP DATABASE IF EXISTS "+name
	default:
		tb.Fatalf("%s has no schemas", d.Name())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, create); err != nil {
		tb.Fatalf("create schema %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, drop); err != nil {
			tb.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// SchemaBackends returns the databases that have schemas: PostgreSQL and
// MySQL/MariaDB.
func SchemaBackends() []Backend {
	var out []Backend
	for _, b := range Backends() {
		if b.Dialect.Name() != "sqlite" {
			out = append(out, b)
		}
	}
	return out
}

// ConsumerPending is how many deliveries of topic the consumer has
// pending in the store, as its pending status counts them.
func ConsumerPending(tb testing.TB, s *sqlstore.Store, topic, consumer string) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sts, err := s.PendingStatus(ctx)
	if err != nil {
		tb.Fatalf("reading the pending status: %v", err)
	}
	for _, st := range sts {
		for _, c := range st.Consumers {
			if st.Topic == topic && c.Consumer == consumer {
				return c.Pending
			}
		}
	}
	return 0
}
