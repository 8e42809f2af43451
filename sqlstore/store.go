package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// DefaultTable is the table name used when Config.Table is empty.
const DefaultTable = "watermill_outbox"

// Config configures a [Store].
type Config struct {
	// Dialect is the database's dialect. Required.
	Dialect Dialect
	// Table is the record table: a plain identifier ([A-Za-z_][A-Za-z0-9_]*,
	// at most 48 bytes), or on PostgreSQL and MySQL/MariaDB one qualified by
	// a schema, "schema.table" (on MySQL/MariaDB the schema is a database),
	// each part such an identifier and quoted on its own. Everything the
	// store keeps lives beside the table: its <table>_consumers table, its
	// indexes, and its row in the schema's own [VersionTable], so two
	// schemas with tables of one name have their own records, versions and
	// identities. The schema must exist; the store does not create it. A
	// name without a schema is found as the database finds any unqualified
	// name (PostgreSQL's search_path, MySQL's current database). SQLite
	// refuses a qualified name. Defaults to "watermill_outbox".
	Table string
	// Completion is what happens to a handled record. Defaults to [Mark].
	Completion Completion
	// DB is the connection pool. It may be nil and attached later with
	// [Store.Attach].
	DB *sqlx.DB
	// Lease turns on the delivery lease: CheckPending claims the pending
	// record for this long, by the database clock, and a second copy of the
	// message delivered meanwhile gets [recordstore.ErrLeased] (the middleware
	// nacks it) instead of running the handler at the same moment. Choose
	// it longer than the longest handler run: a handler that outlives its
	// lease may overlap a redelivery. A crashed handler's lease runs out and
	// the record can be claimed again. Defaults to 0, no lease.
	Lease time.Duration
	// DurableCompletion makes Complete wait until its commit is on disk.
	// Defaults to false: on PostgreSQL, Complete's statements (not
	// [Store.CompleteTx], which runs in the caller's transaction, and not
	// Insert) commit with synchronous_commit off, for their own transaction
	// alone, so that a delivery does not wait for a disk flush. A
	// PostgreSQL server crash within the WAL writer's delay (a few hundred
	// milliseconds) can then lose completions, never records: those
	// records stay pending and are sent again, a duplicate that
	// at-least-once delivery allows. A crash of the service loses nothing
	// more than with it set. MySQL, MariaDB and SQLite have no such
	// per-statement setting and always wait.
	DurableCompletion bool
	// Coalescing combines concurrent inserts, and concurrent completions,
	// into one statement each. Defaults to combining both, one statement of
	// each kind in flight, at most 1000 records per statement; see
	// [Coalescing].
	Coalescing Coalescing
}

func (c *Config) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	c.Coalescing.setDefaults()
	if c.Coalescing.InsertsAloneBelow == 0 && c.Dialect != nil {
		c.Coalescing.InsertsAloneBelow = c.Dialect.insertsAloneBelow()
	}
}

// Validate reports a configuration error, if any.
func (c Config) Validate() error {
	if c.Dialect == nil {
		return fmt.Errorf("%w: Dialect is required (sqlstore.Postgres(), sqlstore.MySQL() or sqlstore.SQLite())", ErrInvalidConfig)
	}
	if c.Completion != Mark && c.Completion != Delete {
		return fmt.Errorf("%w: unknown Completion %d", ErrInvalidConfig, int(c.Completion))
	}
	if c.Lease < 0 {
		return fmt.Errorf("%w: Lease %v is negative", ErrInvalidConfig, c.Lease)
	}
	if err := c.Coalescing.Validate(); err != nil {
		return err
	}
	_, err := parseTable(c.Dialect, c.Table)
	return err
}

// Store is an [recordstore.Store] over one SQL table.
type Store struct {
	// versioned is the table as configured and parsed, and its row in the
	// schema version table.
	versioned
	mode  Completion
	lease time.Duration
	// leaseArg is lease as the claim's argument, made once.
	leaseArg any
	q        *queries
	// att is the attached pool; probeMu serializes probing it.
	att     atomic.Pointer[attachment]
	probeMu sync.Mutex
	// migrations holds migrations/<dialect>/NNN_name.sql.
	migrations fs.FS
	coalescing Coalescing
	// inserts, checks and completes combine concurrent calls; nil when
	// disabled.
	inserts   *coalescer[[]recordstore.Record]
	checks    *coalescer[recordstore.Delivery]
	completes *coalescer[recordstore.Delivery]
}

var _ recordstore.Store = (*Store)(nil)

// New returns a store for the table; it does not touch the database. Call
// [Store.Migrate] to create the table, or use [OpenTable] for a table that
// exists.
//
// A pool whose driver is known to be for another database than the dialect
// (pgx or lib/pq, go-sql-driver/mysql, modernc.org/sqlite or mattn's
// go-sqlite3, told by the driver's type or the name sqlx was given) is
// refused with an error wrapping [ErrInvalidConfig] that names both. Other
// drivers are accepted with any dialect.
func New(cfg Config) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.DB != nil {
		if err := checkDriver(cfg.Dialect, cfg.DB); err != nil {
			return nil, err
		}
	}
	name, err := parseTable(cfg.Dialect, cfg.Table)
	if err != nil {
		return nil, err
	}
	s := &Store{mode: cfg.Completion, lease: cfg.Lease, migrations: migrationFiles}
	s.q = buildQueries(cfg.Dialect, name, cfg.Completion, cfg.DurableCompletion)
	s.versioned = versioned{dialect: cfg.Dialect, table: cfg.Table, name: name, kind: cfg.Completion.String(), vq: &s.q.versionQueries}
	s.leaseArg = cfg.Dialect.leaseArg(cfg.Lease)
	co := cfg.Coalescing
	s.coalescing = co
	if !co.DisableInsert {
		s.inserts = newCoalescer(co.MaxInFlight, co.MaxBatch, s.insertNow, s.insertBatch)
		s.inserts.fewCallers = max(0, co.InsertsAloneBelow)
	}
	if !co.DisableCheck && cfg.Lease == 0 && s.q.stateMany != "" {
		s.checks = newCoalescer(co.MaxInFlight, co.MaxBatch, s.checkNow, s.checkBatch)
	}
	if !co.DisableComplete && cfg.Dialect.batchComplete(cfg.Completion) {
		s.completes = newCoalescer(co.MaxInFlight, co.MaxBatch, s.completeFast, s.completeBatch)
		s.completes.alone = s.completeNow
	}
	if cfg.DB != nil {
		s.Attach(cfg.DB)
	}
	return s, nil
}

// Table returns the table name as configured, "schema.table" when it is
// qualified.
func (s *Store) Table() string { return s.table }

// Completion returns what the store does with handled records.
func (s *Store) Completion() Completion { return s.mode }

// Coalescing returns how the store combines concurrent calls, with the
// defaults filled in.
func (s *Store) Coalescing() Coalescing { return s.coalescing }

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

// Insert implements [recordstore.Store]. Concurrent calls are combined into one
// statement as [Coalescing] says; each gets its own ids and its own error.
func (s *Store) Insert(ctx context.Context, records []recordstore.Record) error {
	if len(records) == 0 {
		return nil
	}
	if _, err := s.pool(); err != nil {
		return err
	}
	if s.inserts == nil {
		return s.insertNow(ctx, records)
	}
	return s.inserts.do(ctx, records, len(records))
}

// insertNow saves records with one statement (several for MySQL batches
// larger than a packet), and, when some declare consumers, their deliveries
// in the same transaction.
func (s *Store) insertNow(ctx context.Context, records []recordstore.Record) error {
	db, d, err := s.bound(ctx)
	if err != nil {
		return err
	}
	if err := s.insertWith(ctx, db, d, "insert", records); err != nil {
		if errors.Is(err, ErrInvalidRecord) || errors.Is(err, ErrRecordTooLarge) {
			return err
		}
		return s.failInsert(db, d, err)
	}
	return nil
}

// failInsert is fail for an insert, saying also whether the records may
// have been saved ([recordstore.ErrOutcomeUnknown]) and, when ctx ended
// while every connection of the pool was in use, what that usually means.
func (s *Store) failInsert(db *sqlx.DB, d Dialect, err error) error {
	te := *s.fail("insert", err).(*TableError) //nolint:errorlint // fail returns a *TableError
	if st := db.Stats(); errors.Is(err, context.DeadlineExceeded) && st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
		te.Err = fmt.Errorf("%w (all %d connection(s) of the pool were in use: a publish inside a transaction of the same pool, such as a CompleteTx transaction, waits for a connection that transaction holds; publish with outbox.TxPublisher in that transaction, or give the pool more connections)", te.Err, st.MaxOpenConnections)
	}
	if !d.answered(err) {
		te.Err = fmt.Errorf("%w: %w", recordstore.ErrOutcomeUnknown, te.Err)
	}
	return &te
}

// insertWith saves records through db, the pool or a caller's
// transaction; a batch in which some records have an Origin goes through
// insertKeyed.
func (s *Store) insertWith(ctx context.Context, db executor, d Dialect, op string, records []recordstore.Record) error {
	if keyed(records) {
		return s.insertKeyed(ctx, db, d, op, records)
	}
	return s.insertRows(ctx, db, d, op, &s.q.insert, records)
}

// insertRows saves records with the statements st. Records without
// consumers that fit one statement cost the one statement they always did;
// a batch that needs several statements, and the deliveries of records with
// consumers, are saved in one transaction (inTx fails as op). Refused
// records are reported before anything is sent.
func (s *Store) insertRows(ctx context.Context, db executor, d Dialect, op string, st *insertStatements, records []recordstore.Record) error {
	metadata := make([]string, len(records))
	for i, r := range records {
		md, err := encodeMetadata(r.Metadata)
		if err != nil {
			return fmt.Errorf("record #%d: %w", i, err)
		}
		metadata[i] = md
	}
	bounds, err := d.splitInsert(st, records, metadata)
	if err != nil {
		return err
	}
	withConsumers := declaresConsumers(records)
	if len(bounds) == 2 && !withConsumers {
		return d.insert(ctx, db, st, records, metadata)
	}
	return s.inTx(ctx, db, op, func(tx executor) error {
		for i := 1; i < len(bounds); i++ {
			from, to := bounds[i-1], bounds[i]
			if err := d.insert(ctx, tx, st, records[from:to], metadata[from:to]); err != nil {
				return err
			}
		}
		if !withConsumers {
			return nil
		}
		return s.insertDeliveries(ctx, tx, records)
	})
}

// CheckPending implements [recordstore.Store] with one query in the common case:
// it reads the record and the consumer's delivery row together and decides
// from them. On PostgreSQL, concurrent calls are combined into one query as
// [Coalescing] says; each gets its own verdict. With a [Config.Lease] it claims the record, or the consumer's
// delivery, returning [recordstore.ErrLeased] while another delivery holds it;
// see claim.
func (s *Store) CheckPending(ctx context.Context, d recordstore.Delivery) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	if s.lease > 0 {
		return s.claim(ctx, db, d)
	}
	if s.checks != nil {
		return s.checks.do(ctx, d, 1)
	}
	return s.checkPending(ctx, db, d)
}

// checkNow checks one delivery (the coalescer's single path).
func (s *Store) checkNow(ctx context.Context, d recordstore.Delivery) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	return s.checkPending(ctx, db, d)
}

// Complete implements [recordstore.Store]. Concurrent calls are combined into one
// statement as [Coalescing] says; each gets its own outcome. A delivery
// whose [recordstore.Delivery.UUID] is not the record's completes nothing
// and gets [recordstore.ErrNotPending]: the statement that completes
// matches no row, and telling why would cost another round trip.
func (s *Store) Complete(ctx context.Context, d recordstore.Delivery) error {
	if _, err := s.pool(); err != nil {
		return err
	}
	if s.completes == nil {
		return s.completeNow(ctx, d)
	}
	return s.completes.do(ctx, d, 1)
}

// completeNow completes one delivery: a record without consumers with one
// statement, a consumer's delivery otherwise (see completeDelivery). The
// delivery of a consumer its topic declares never completes a record as
// one without consumers: such a record is adopted (adopt.go).
func (s *Store) completeNow(ctx context.Context, d recordstore.Delivery) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	if declares(d) {
		return s.completeDeliveryNow(ctx, db, d)
	}
	n, err := s.exec(ctx, db, "complete", s.q.completeAlone, s.completeArgs(d)...)
	if err != nil {
		return err
	}
	if n == 1 {
		return nil
	}
	return s.completeDeliveryNow(ctx, db, d)
}

// completeFast is the coalesced path's completion of one delivery, run in
// a statement slot: it never waits for a row that another transaction
// holds (a CompleteTx still open), and leaves a consumer's delivery, whose
// completion locks its record's row, to completeNow outside the slot
// (errAlone), so that no completion waits for another's transaction.
func (s *Store) completeFast(ctx context.Context, d recordstore.Delivery) error {
	if s.q.completeSkipLocked == "" {
		return s.completeNow(ctx, d)
	}
	if declares(d) {
		return errAlone
	}
	db, err := s.pool()
	if err != nil {
		return err
	}
	n, err := s.exec(ctx, db, "complete", s.q.completeSkipLocked, s.completeArgs(d)...)
	if err != nil {
		return err
	}
	if n == 1 {
		return nil
	}
	return errAlone
}

// completeArgs are the arguments of q.complete.
func (s *Store) completeArgs(d recordstore.Delivery) []any {
	if s.q.mark {
		return []any{d.Consumer, d.ID, d.UUID, d.UUID}
	}
	return []any{d.ID, d.UUID, d.UUID}
}

// PendingAfter implements [recordstore.Store]. Each record's metadata is a map of
// its own, which the caller may change.
func (s *Store) PendingAfter(ctx context.Context, topic string, afterID int64, limit int) ([]recordstore.Record, error) {
	return s.PendingAfterBytes(ctx, topic, afterID, limit, 0)
}

// PendingAfterBytes implements [recordstore.ByteBoundedReader]: it stops
// reading the rows, which database/sql streams, once the page holds
// maxBytes. The rows not read are still received and discarded by the
// driver, so a caller should lower limit to what the budget holds.
func (s *Store) PendingAfterBytes(ctx context.Context, topic string, afterID int64, limit, maxBytes int) ([]recordstore.Record, error) {
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, s.q.pendingAfter, topic, afterID, limit)
	if err != nil {
		return nil, s.fail("read pending", err)
	}
	return s.scanPending(rows, topic, min(limit, 1024), maxBytes)
}
