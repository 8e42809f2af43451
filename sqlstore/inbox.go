package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// DefaultInboxTable is the table name used when InboxConfig.Table is empty.
const DefaultInboxTable = "watermill_inbox"

// MaxInboxField is the longest Consumer, MessageUUID, BusinessKey and
// Source, in bytes, that an [Inbox] keeps: its key columns must fit
// MySQL's index limits. A longer one is refused with an error wrapping
// [ErrInvalidEntry] before anything is sent, as is one with bytes the
// database cannot keep: a NUL byte or invalid UTF-8 on PostgreSQL, invalid
// UTF-8 in the Source on MySQL/MariaDB.
const MaxInboxField = 255

// inboxKind is what the version row of an inbox holds in its completion
// column: a record store refuses a table with it, and an inbox a record
// table.
const inboxKind = "inbox"

// InboxConfig configures an [Inbox].
type InboxConfig struct {
	// Dialect is the database's dialect. Required.
	Dialect *Dialect
	// DB is the connection pool. Required.
	DB *sqlx.DB
	// Table is the inbox table, named as [Config.Table] is: a plain
	// identifier, or on PostgreSQL and MySQL/MariaDB "schema.table". Its
	// schema version is kept in the schema's [VersionTable], in a row of
	// its own keyed by its name, so an inbox and record tables live in one
	// schema as long as their names differ; VersionTable itself is refused.
	// Defaults to "watermill_inbox".
	Table string
}

func (c *InboxConfig) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultInboxTable
	}
}

// Validate reports a configuration error, if any.
func (c InboxConfig) Validate() error {
	if c.Dialect == nil || c.Dialect.name == "" {
		return fmt.Errorf("%w: Dialect is required (sqlstore.Postgres(), sqlstore.MySQL() or sqlstore.SQLite())", ErrInvalidConfig)
	}
	if c.DB == nil {
		return fmt.Errorf("%w: DB is required for inbox %q", ErrInvalidConfig, c.Table)
	}
	name, err := parseTable(c.Dialect, c.Table)
	if err != nil {
		return err
	}
	if name.name == VersionTable {
		return fmt.Errorf("%w: %q is the schema version table's name", ErrInvalidTable, c.Table)
	}
	return checkDriver(c.Dialect, c.DB)
}

// Inbox is a [recordstore.Inbox] over one SQL table, for a receiving
// service that deduplicates the messages of other services in its own
// database. Each entry is one row keyed by (consumer, message_uuid), with a
// unique key on (consumer, business_key) for entries that have a business
// key; entries without one never conflict on it. handled_at is stamped by
// the database clock and indexed for [Inbox.Clean].
type Inbox struct {
	versioned
	db *sqlx.DB
	q  inboxQueries
	// identity is the table's identity once read.
	identity atomic.Pointer[string]
}

var _ recordstore.Inbox = (*Inbox)(nil)

// inboxQueries are an inbox's statements, built once from its validated,
// quoted table name.
type inboxQueries struct {
	versionQueries
	// handled finds an entry by message UUID or business key;
	// handledUUID by message UUID alone.
	handled     string
	handledUUID string
	// insert saves an entry; on a dialect with skipDuplicates it affects
	// no row for a duplicate, on the others it fails with a unique
	// violation.
	insert string
	// clean deletes a bounded batch of old entries.
	clean string
	// recent reads the latest entries, through the handled_at index.
	recent string
}

// inboxEntryColumns are the columns of an entry that HandledAs and
// Recent read, in entryFields' order.
const inboxEntryColumns = "consumer, message_uuid, business_key, source, record_id"

// entryFields are the scan destinations of inboxEntryColumns in e; the
// business key, which may be NULL, goes to business.
func entryFields(e *recordstore.InboxEntry, business *sql.NullString) []any {
	return []any{&e.Consumer, &e.MessageUUID, business, &e.Source, &e.RecordID}
}

func buildInboxQueries(d *Dialect, name tableName) inboxQueries {
	t, p := name.quoted(d), d.placeholder
	return inboxQueries{
		versionQueries: buildVersionQueries(d, name),
		handled: fmt.Sprintf("SELECT %s FROM %s WHERE consumer = %s AND (message_uuid = %s OR business_key = %s) ORDER BY CASE WHEN message_uuid = %s THEN 0 ELSE 1 END LIMIT 1",
			inboxEntryColumns, t, p(1), p(2), p(3), p(4)),
		handledUUID: fmt.Sprintf("SELECT %s FROM %s WHERE consumer = %s AND message_uuid = %s", inboxEntryColumns, t, p(1), p(2)),
		insert: fmt.Sprintf("INSERT INTO %s (consumer, message_uuid, business_key, source, record_id, handled_at) VALUES (%s, %s, %s, %s, %s, %s)%s",
			t, p(1), p(2), p(3), p(4), p(5), d.clock, d.skipDuplicates),
		clean:  d.deleteOldest(t, "handled_at < "+d.ago(1), "handled_at", p(2)),
		recent: fmt.Sprintf("SELECT %s, %s FROM %s ORDER BY handled_at DESC LIMIT %s", inboxEntryColumns, d.ageMicros("handled_at"), t, p(1)),
	}
}

// NewInbox returns an inbox for the table; it does not touch the database.
// Call [Inbox.Migrate] to create the table. A pool whose driver is known to
// be for another database than the dialect is refused, as [New] refuses
// it.
func NewInbox(cfg InboxConfig) (*Inbox, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	name, err := parseTable(cfg.Dialect, cfg.Table)
	if err != nil {
		return nil, err
	}
	in := &Inbox{db: cfg.DB, q: buildInboxQueries(cfg.Dialect, name)}
	in.versioned = versioned{dialect: cfg.Dialect, table: cfg.Table, name: name, kind: inboxKind, identityFrom: 1, vq: &in.q.versionQueries}
	return in, nil
}

// Table returns the table name as configured, "schema.table" when it is
// qualified.
func (in *Inbox) Table() string { return in.table }

// DB returns the connection pool.
func (in *Inbox) DB() *sqlx.DB { return in.db }

// Handled implements [recordstore.Inbox] with one query that looks the entry
// up by its primary key and, when the entry has a business key, by its
// unique key too. It does not wait for a transaction that is saving the
// entry and has not committed: that one reports false until it commits.
func (in *Inbox) Handled(ctx context.Context, e recordstore.InboxEntry) (bool, error) {
	found, err := in.HandledAs(ctx, e)
	return found != nil, err
}

var _ recordstore.InboxFinder = (*Inbox)(nil)

// HandledAs implements [recordstore.InboxFinder]: the query of Handled,
// which reads the entry it finds (the entry of e's message UUID when both
// match). The entry returned is the one stored, with the Source and
// RecordID of the copy that was handled, not e's.
func (in *Inbox) HandledAs(ctx context.Context, e recordstore.InboxEntry) (*recordstore.InboxEntry, error) {
	if err := in.validate(e); err != nil {
		return nil, in.fail("check inbox", err)
	}
	query, args := in.q.handledUUID, []any{e.Consumer, e.MessageUUID}
	if e.BusinessKey != "" {
		query, args = in.q.handled, append(args, e.BusinessKey, e.MessageUUID)
	}
	var found recordstore.InboxEntry
	var business sql.NullString
	err := in.db.QueryRowContext(ctx, query, args...).Scan(entryFields(&found, &business)...)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, in.fail("check inbox", err)
	}
	found.BusinessKey = business.String
	return &found, nil
}

// Identity returns the inbox table's identity, which Migrate gives it and
// keeps in [VersionTable]: the receiving service's name in the
// confirmations it sends, so that a sender sees two services that confirm
// under one consumer name. It is read once, then kept.
func (in *Inbox) Identity(ctx context.Context) (string, error) {
	if id := in.identity.Load(); id != nil {
		return *id, nil
	}
	id, err := in.readIdentity(ctx, in.db)
	if err != nil {
		return "", err
	}
	if id == "" {
		return "", &TableError{Table: in.table, Op: "read identity", Err: fmt.Errorf("%w: the inbox has no identity; run Inbox.Migrate", ErrSchemaVersion)}
	}
	in.identity.Store(&id)
	return id, nil
}

// MarkHandled implements [recordstore.Inbox]: one INSERT on the inbox's
// pool, committed on its own. An entry whose message UUID or business key
// the consumer already has returns [recordstore.ErrAlreadyHandled].
func (in *Inbox) MarkHandled(ctx context.Context, e recordstore.InboxEntry) error {
	return in.mark(ctx, in.db, "mark handled", e)
}

// MarkHandledTx implements [recordstore.Inbox]: the INSERT of MarkHandled
// run through tx, the handler's transaction on the inbox's database, so that
// the entry commits or rolls back with the handler's writes.
//
// A transaction saving an entry that another, uncommitted transaction saved
// waits for it: it gets [recordstore.ErrAlreadyHandled] once that one
// commits, and saves the entry once it rolls back. The handler then rolls
// its transaction back and acknowledges the message. After
// ErrAlreadyHandled tx is still usable on every database: PostgreSQL and
// SQLite skip the duplicate row (INSERT … ON CONFLICT DO NOTHING), and
// MySQL/MariaDB roll back only the refused statement. Under REPEATABLE READ
// or SERIALIZABLE, PostgreSQL reports an entry committed after tx began as
// a serialization failure instead, which the handler returns like any
// error; the redelivery then finds the entry.
//
// On SQLite, which has one writer at a time, the wait is for the write
// lock, under the pool's busy timeout: run MarkHandledTx first in the
// transaction, or open the pool with _txlock=immediate, as for
// [Store.CompleteTx].
func (in *Inbox) MarkHandledTx(ctx context.Context, tx recordstore.Tx, e recordstore.InboxEntry) error {
	if tx == nil {
		return fmt.Errorf("%w: transaction is nil", ErrInvalidConfig)
	}
	return in.mark(ctx, tx, "mark handled in transaction", e)
}

// mark saves the entry through db: the pool or a caller's transaction.
func (in *Inbox) mark(ctx context.Context, db executor, op string, e recordstore.InboxEntry) error {
	if err := in.validate(e); err != nil {
		return in.fail(op, err)
	}
	business := sql.NullString{String: e.BusinessKey, Valid: e.BusinessKey != ""}
	res, err := db.ExecContext(ctx, in.q.insert, e.Consumer, e.MessageUUID, business, e.Source, e.RecordID)
	if err != nil {
		return in.fail(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return in.fail(op, err)
	}
	if n == 0 {
		return in.alreadyHandled(op, e)
	}
	return nil
}

// fail is [versioned.fail], with a unique violation, the one error an
// insert of the inbox is refused with for a duplicate, as
// [recordstore.ErrAlreadyHandled], and the database refusing a value of the
// entry as an entry it cannot keep, [ErrInvalidEntry].
func (in *Inbox) fail(op string, err error) error {
	switch {
	case in.dialect.uniqueViolation(err):
		err = fmt.Errorf("%w: %w", recordstore.ErrAlreadyHandled, err)
	case in.dialect.invalidValue(err):
		err = fmt.Errorf("%w: %w", ErrInvalidEntry, err)
	}
	return in.versioned.fail(op, err)
}

// alreadyHandled is the error of an entry that the consumer already has.
func (in *Inbox) alreadyHandled(op string, e recordstore.InboxEntry) error {
	return &TableError{Table: in.table, Op: op, Err: fmt.Errorf("%w: consumer %q, message %q, business key %q",
		recordstore.ErrAlreadyHandled, e.Consumer, e.MessageUUID, e.BusinessKey)}
}

// validate refuses an entry without a consumer or a message UUID, or with a
// field longer than MaxInboxField or holding what its column cannot keep.
func (in *Inbox) validate(e recordstore.InboxEntry) error {
	switch {
	case e.Consumer == "":
		return fmt.Errorf("%w: Consumer is empty", ErrInvalidEntry)
	case e.MessageUUID == "":
		return fmt.Errorf("%w: MessageUUID is empty (consumer %q)", ErrInvalidEntry, e.Consumer)
	}
	for _, f := range []struct {
		name, value string
		kind        column
	}{
		{"Consumer", e.Consumer, in.dialect.nameColumn}, {"MessageUUID", e.MessageUUID, in.dialect.nameColumn},
		{"BusinessKey", e.BusinessKey, in.dialect.nameColumn}, {"Source", e.Source, in.dialect.textColumn},
	} {
		if len(f.value) > MaxInboxField {
			return fmt.Errorf("%w: %s is %d bytes, longer than %d", ErrInvalidEntry, f.name, len(f.value), MaxInboxField)
		}
		if why := f.kind.refuses(f.value); why != "" {
			return fmt.Errorf("%w: %s %.64q has %s (%w)", ErrInvalidEntry, f.name, f.value, why, recordstore.ErrInvalidValue)
		}
	}
	return nil
}

// Clean implements [recordstore.Inbox]: one statement deletes at most limit
// entries whose handled_at is older than olderThan by the database clock,
// oldest first, through the handled_at index. On PostgreSQL it skips
// entries another Clean is deleting; on MySQL/MariaDB it runs READ
// COMMITTED, so that it takes no gap locks that new entries would wait for,
// as the record store's Clean does. Call it until it returns less than
// limit to clean a backlog in bounded batches.
//
// Choose olderThan longer than the longest time the sending services may
// resend a message after first sending it: a copy that arrives after its
// entry is cleaned runs the handler again.
func (in *Inbox) Clean(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := checkClean(in.table, olderThan, limit); err != nil {
		return 0, err
	}
	tx, err := in.db.BeginTxx(ctx, in.dialect.cleanTxOptions)
	if err != nil {
		return 0, in.fail("clean", err)
	}
	defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
	res, err := tx.ExecContext(ctx, in.q.clean, micros(olderThan), limit)
	if err != nil {
		return 0, in.fail("clean", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, in.fail("clean", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, in.fail("clean", err)
	}
	return int(n), nil
}
