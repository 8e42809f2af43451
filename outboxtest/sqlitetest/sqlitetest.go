// Package sqlitetest opens an SQLite database for a test, in process and
// with no server: an inbox table of the sqlstore package beside the test's
// own tables. It is the kit for testing a receiver whose handler writes its
// effect in the transaction that records the message in its inbox
// (outbox.InboxTx), a transaction that the in-memory inbox of outboxtest
// cannot join:
//
//	db := sqlitetest.Open(t, "CREATE TABLE invoices (order_uuid TEXT NOT NULL)")
//	receiver := outboxtest.NewRegistry(t) // tracks nothing of its own
//	cfg := outbox.MiddlewareConfig{Inbox: db.Inbox}
//	got := outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", invoice(db), msg)
//	require.True(t, got.Acked)
//	require.Equal(t, []string{msg.UUID}, db.Handled(t, "billing"))
//
// The handler begins its transaction on the [DB] (db.BeginTxx), calls
// outbox.InboxTx with it first and writes its effect through it, as it does
// on the service's own database.
package sqlitetest

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // the pure Go driver that sqlstore's SQLite dialect is for

	"github.com/wmoutbox/outbox/sqlstore"
)

// busyTimeout is how long, in milliseconds, a statement waits for another
// connection's write lock before it fails.
const busyTimeout = 10_000

// DB is a test's SQLite database, opened by [Open]: the pool, embedded, for
// the handler under test and the test's own queries, and the inbox kept in
// it.
type DB struct {
	*sqlx.DB
	// Inbox is the inbox over the database's table
	// sqlstore.DefaultInboxTable, created by Open, for
	// outbox.MiddlewareConfig.Inbox.
	Inbox *sqlstore.Inbox
	// Path is the database's file, in the test's tb.TempDir.
	Path string
}

// Open creates an SQLite database in a file of tb.TempDir, with an inbox
// table ([DB.Inbox]), executes the schema statements in order (the test's
// business tables, say; one string may hold several statements), and
// closes it when the test ends. It fails the test on any error.
//
// The database runs in WAL mode, so that reads do not wait for a writer,
// and every transaction begins IMMEDIATE, taking the write lock first:
// transactions at the same moment, such as those of two copies of a
// message handled together, wait for each other (up to 10 seconds) instead
// of failing with SQLITE_BUSY, as a server database's do. The pool opens
// as many connections as it is asked for, so a handler may read through
// the pool while its transaction is open.
func Open(tb testing.TB, schema ...string) *DB {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "test.db")
	// A plain path, not a "file:" URI: a test's name, and so its TempDir,
	// may hold '#' or '%', which a URI would read as a fragment or an
	// escape, opening another file.
	dsn := fmt.Sprintf("%s?_pragma=journal_mode(WAL)&_pragma=busy_timeout(%d)&_txlock=immediate", path, busyTimeout)
	pool, err := sqlx.Open("sqlite", dsn)
	if err != nil {
		tb.Fatalf("sqlitetest: opening %s: %v", path, err)
	}
	db := &DB{DB: pool, Path: path}
	tb.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	db.Inbox, err = sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: sqlstore.SQLite(), DB: pool})
	if err != nil {
		tb.Fatalf("sqlitetest: %v", err)
	}
	if err := db.Inbox.Migrate(ctx); err != nil {
		tb.Fatalf("sqlitetest: creating the inbox table: %v", err)
	}
	for i, stmt := range schema {
		if _, err := pool.ExecContext(ctx, stmt); err != nil {
			tb.Fatalf("sqlitetest: schema statement %d: %v", i+1, err)
		}
	}
	return db
}

// handledQuery lists a consumer's entries in the order they were saved:
// the inbox table has a rowid, which grows with each insert.
const handledQuery = `SELECT message_uuid FROM "` + sqlstore.DefaultInboxTable + `" WHERE consumer = ? ORDER BY rowid`

// Handled returns the message UUIDs of the consumer's entries in the inbox,
// in the order they were saved: the messages the consumer has handled. An
// entry saved in a transaction that has not committed is not among them.
// It fails the test if the inbox cannot be read.
func (db *DB) Handled(tb testing.TB, consumer string) []string {
	tb.Helper()
	var uuids []string
	if err := db.SelectContext(context.Background(), &uuids, handledQuery, consumer); err != nil {
		tb.Fatalf("sqlitetest: reading the inbox of consumer %q: %v", consumer, err)
	}
	return uuids
}

// Close closes the database before the test ends, to test what a handler
// does once its database is gone, say. The test's cleanup then has nothing
// left to close.
func (db *DB) Close() error { return db.DB.Close() }
