// Package sqlstore keeps outbox records in a SQL table: PostgreSQL (pgx
// stdlib driver), MySQL/MariaDB (go-sql-driver/mysql) and SQLite
// (modernc.org/sqlite, pure Go) over database/sql and sqlx.
//
// # Tables
//
// Each [Store] owns one table, created by [Store.Migrate] from migrations
// embedded per dialect and versioned in the table watermill_outbox_schema
// ([VersionTable]) of its schema.
// [Store.Verify] checks that the table exists at the version the code
// expects; outbox.Replay and outbox.ReplayPlugin call it before replaying, so
// a missing or mismatched table stops the start with an error that says what
// to do, naming the dialect and the database. Tools that inspect a table
// they did not configure open it with [OpenTable], which reads the
// completion mode the table was created with. A marking store ([Mark], the default) keeps completed records with
// processed_at set from the database clock; a deleting store ([Delete]) has
// no processed_at column and deletes completed records.
//
// Record ids come from an identity or auto-increment column that never reuses
// a value, so that a copy of a deleted record can never match a new one.
//
// Migrate also gives each table a random identity, kept with its schema
// version; [Store.Identity] returns it, and the publisher stamps it into
// every message so that a receiver acts only on its own table's records.
//
// # Schemas
//
// On PostgreSQL and MySQL/MariaDB a table may be qualified by a schema
// ([Config.Table] "tenant_a.watermill_outbox"; on MySQL a schema is a
// database). Everything the store keeps lives beside the table, in that
// schema: the consumers table, the indexes and the table's row in the
// schema's own watermill_outbox_schema, so that one table name in two
// schemas gives two tables with their own records, versions and identities.
// The schema must exist: the store never creates one, and names a missing
// one with [ErrSchemaMissing]. SQLite table names are never qualified.
//
// # Several receivers
//
// A record saved with consumers (recordstore.Record.Consumers) gets one delivery
// row per consumer in the table <table>_consumers. Each consumer checks and
// completes its own row; the record stays pending until none is, and is
// then completed (marked, or deleted with its delivery rows) or, if a
// delivery was abandoned, abandoned. Completions of one record lock its row
// first, so that on every database the last of them sees the others and
// completes the record. A record saved without consumers has one receiver:
// a marking table keeps the consumer that completed it (completed_by), so
// that another consumer's copy is reported as a conflict rather than taken
// for a duplicate. Records without consumers cost what they always did: one
// INSERT, one completion statement.
//
// # Inbox
//
// A receiving service with a database of its own keeps an [Inbox]: a table
// (watermill_inbox by default) of the other services' messages each
// consumer handled, keyed by consumer and message UUID, and optionally by
// consumer and business key. [Inbox.MarkHandledTx] saves the entry in the
// handler's transaction, so that the entry and the handler's writes commit
// together; [Inbox.Clean] deletes old entries. Its version row sits in the
// same [VersionTable] as the record tables', keyed by its own name. See
// docs/operations.md for how long to keep entries.
//
// # Coalescing
//
// Concurrent [Store.Insert] calls that arrive while an insert is in flight
// are combined into one multi-row INSERT, and concurrent [Store.Complete]
// calls of records without consumers into one UPDATE (or DELETE) … WHERE
// id IN (…) RETURNING id per consumer. There is
// no timer: a call that finds the store idle runs at once, alone, and batches
// grow only with contention. Each call keeps its own outcome: its own ids in
// the order of its records, [recordstore.ErrNotPending] for its own id, its own
// error. See [Coalescing] for the settings and the failure rules.
//
// # Connection
//
// The *sqlx.DB may be passed in [Config] or attached later with
// [Store.Attach]; the hot path reads it with one atomic load. A pool whose
// driver is for another database than the dialect (a SQLite pool given
// [Postgres]) is refused with an error that names both. Every query runs
// on that pool, never in a caller's transaction.
//
// For SQLite use a file database in WAL mode with a busy timeout, e.g.
// "file:outbox.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)", and
// db.SetMaxOpenConns(1): SQLite has one writer at a time, and queueing in the
// pool is far faster under concurrency than connections contending for the
// file lock. The outbox never holds a connection while a handler runs, so
// one connection is enough.
//
// For MySQL and MariaDB set interpolateParams=true in the DSN, e.g.
// "user:password@tcp(127.0.0.1:3306)/app?interpolateParams=true", and keep
// the driver's default utf8mb4 character set and the server's strict SQL
// mode; see [MySQL] for why, and for how a batch gets its record ids.
//
// # Contract
//
// The package storetest is the suite every store here passes, run against
// PostgreSQL, MariaDB and SQLite.
package sqlstore
