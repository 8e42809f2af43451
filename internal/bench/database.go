package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	_ "github.com/go-sql-driver/mysql" // MariaDB driver
	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL driver
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // SQLite driver

	"github.com/wmoutbox/outbox/sqlstore"
)

// poolSize is the connection pool of every case: enough for 16 publishers
// and 16 handlers each holding a connection, and the same for raw SQL.
const poolSize = 40

// database is one database the suite runs on.
type database struct {
	name    string
	dialect *sqlstore.Dialect
	db      *sqlx.DB
	version string
	tmpDir  string
	// meter is the connection the cost counters are read on, nil on
	// SQLite; serverPID the server's process on this machine, 0 when
	// unknown.
	meter     *sqlx.DB
	serverPID int
}

// dsns are the servers' DSNs; SQLite needs none.
type dsns struct {
	postgres string
	mysql    string
}

func openDatabase(ctx context.Context, name string, dsn dsns) (*database, error) {
	d := &database{name: name}
	var err error
	switch name {
	case "postgres":
		d.dialect = sqlstore.Postgres()
		d.db, err = sqlx.Open("pgx", withApplicationName(dsn.postgres))
	case "mariadb":
		d.dialect = sqlstore.MySQL()
		d.db, err = sqlx.Open("mysql", dsn.mysql)
	case "sqlite":
		d.dialect = sqlstore.SQLite()
		if d.tmpDir, err = os.MkdirTemp("", "outbox-bench"); err != nil {
			return nil, err
		}
		d.db, err = sqlx.Open("sqlite", d.sqliteDSN())
	default:
		return nil, fmt.Errorf("unknown database %q (postgres, mariadb, sqlite)", name)
	}
	if err != nil {
		return nil, err
	}
	d.db.SetMaxOpenConns(poolSize)
	d.db.SetMaxIdleConns(poolSize)
	versionQuery, product := "SHOW server_version", "PostgreSQL "
	switch name {
	case "mariadb":
		versionQuery, product = "SELECT VERSION()", "MariaDB "
	case "sqlite":
		versionQuery, product = "SELECT sqlite_version()", "SQLite "
	}
	if err := d.db.GetContext(ctx, &d.version, versionQuery); err != nil {
		d.close()
		return nil, fmt.Errorf("%s is not reachable: %w", name, err)
	}
	d.version = product + d.version
	switch name {
	case "postgres":
		err = d.openMeter(ctx, "pgx", dsn.postgres)
	case "mariadb":
		err = d.openMeter(ctx, "mysql", dsn.mysql)
	}
	if err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// clock is the database's expression for the current time, as the
// outbox's own statements write it into processed_at.
func (d *database) clock() string {
	switch d.name {
	case "mariadb":
		return "UTC_TIMESTAMP(6)"
	case "sqlite":
		return "strftime('%Y-%m-%d %H:%M:%f', 'now')"
	}
	return "now()"
}

// sqliteDSN is the SQLite file with the settings the README recommends: WAL
// and a busy timeout.
func (d *database) sqliteDSN() string {
	return "file:" + filepath.Join(d.tmpDir, "bench.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)"
}

// writerStore is a second store on s's table for a writer that runs
// transactions reading before they write, such as the Cleaner's deletes. On
// SQLite it opens a pool whose transactions take the write lock when they
// begin (_txlock=immediate), which sqlstore says a pool of more than one
// connection needs for such transactions: a deferred one fails with
// SQLITE_BUSY when another connection wrote since it read. Elsewhere it is
// s. close releases the pool.
func (d *database) writerStore(s *sqlstore.Store) (w *sqlstore.Store, close func(), err error) {
	if d.name != "sqlite" {
		return s, func() {}, nil
	}
	db, err := sqlx.Open("sqlite", d.sqliteDSN()+"&_txlock=immediate")
	if err != nil {
		return nil, nil, err
	}
	w, err = sqlstore.New(sqlstore.Config{Dialect: d.dialect, Table: s.Table(), DB: db, Completion: s.Completion()})
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return w, func() { _ = db.Close() }, nil
}

func (d *database) close() {
	_ = d.db.Close()
	if d.meter != nil {
		_ = d.meter.Close()
	}
	if d.tmpDir != "" {
		_ = os.RemoveAll(d.tmpDir)
	}
}

// newStore creates a fresh outbox table of the default completion (it
// deletes completed records); drop removes it.
func (d *database) newStore(ctx context.Context, co sqlstore.Coalescing) (*sqlstore.Store, error) {
	return d.newStoreOf(ctx, co, sqlstore.Delete)
}

// newStoreOf is newStore with the completion mode given.
func (d *database) newStoreOf(ctx context.Context, co sqlstore.Coalescing, mode sqlstore.Completion) (*sqlstore.Store, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	s, err := sqlstore.New(sqlstore.Config{Dialect: d.dialect, Table: "bench_" + hex.EncodeToString(b[:]), DB: d.db, Coalescing: co, Completion: mode})
	if err != nil {
		return nil, err
	}
	return s, s.Migrate(ctx)
}

// newPartitionedStore is newStore of a partitioned table
// (sqlstore.Config.PartitionEvery), on PostgreSQL only.
func (d *database) newPartitionedStore(ctx context.Context, co sqlstore.Coalescing) (*sqlstore.Store, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	s, err := sqlstore.New(sqlstore.Config{Dialect: d.dialect, Table: "bench_" + hex.EncodeToString(b[:]), DB: d.db, Coalescing: co, Completion: sqlstore.Mark, PartitionEvery: 24 * time.Hour})
	if err != nil {
		return nil, err
	}
	return s, s.Migrate(ctx)
}

// drop removes a table the suite created; its name is a generated
// identifier, validated by sqlstore.New.
func (d *database) drop(ctx context.Context, s *sqlstore.Store) {
	_, _ = d.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+s.Table())
	_, _ = d.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+s.Table()+"_consumers")
	_, _ = d.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+s.Table()+"_seen")
	_, _ = d.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+s.Table()+"_declared")
	_, _ = d.db.ExecContext(ctx, d.db.Rebind("DELETE FROM "+sqlstore.VersionTable+" WHERE table_name = ?"), s.Table())
}

// defaultInFlight is the MaxInFlight the default cases run with.
func (d *database) defaultInFlight(o options) (int, error) {
	s, err := sqlstore.New(sqlstore.Config{Dialect: d.dialect, Coalescing: o.coalesced()})
	if err != nil {
		return 0, err
	}
	return s.Coalescing().MaxInFlight, nil
}
