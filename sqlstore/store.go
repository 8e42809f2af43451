package sqlstore

import (
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
	Dialect *Dialect
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
	// Completion is what happens to a record once it is complete: deleted,
	// or kept, marked, until the Cleaner deletes it. Keeping completed
	// records costs an update (a rewritten row) per completion instead of
	// a delete; see docs/operations.md. A table keeps the mode it was
	// created with: a store of another mode is refused. Defaults to
	// [Delete].
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
	// PartitionEvery makes a new marking table on PostgreSQL a partitioned
	// one: its records go to one partition for this long, then to the
	// next, and the Cleaner drops a whole partition once every record in it
	// was completed longer ago than its OlderThan, instead of deleting them
	// one by one. [Store.Clean] starts the next partition when the current
	// one's first record is older than this, and [Store.Rotate] starts one
	// at once. A partition that holds a pending or abandoned record is kept,
	// and its old completed records are deleted one by one; a partition
	// whose records were all completed is kept whole until its last
	// completion is older than OlderThan, so completed records stay up to
	// OlderThan plus PartitionEvery (and the Cleaner's Interval). Clean
	// counts a dropped partition's records as PostgreSQL estimates them
	// (pg_class.reltuples, which VACUUM and ANALYZE keep). Choose it
	// no longer than the Cleaner's OlderThan. The table must be created
	// partitioned: an existing table cannot become one, and [Store.Verify]
	// refuses the option on a table of one piece. A store without it works
	// on a partitioned table (an operator's tool, say), but its Clean
	// deletes records one by one, as on a table of one piece: set it on
	// every store that runs the Cleaner. Other databases, and deleting
	// tables, refuse it. Defaults to 0, a table of one piece.
	PartitionEvery time.Duration
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
}

// Validate reports a configuration error, if any.
func (c Config) Validate() error {
	if c.Dialect == nil || c.Dialect.name == "" {
		return fmt.Errorf("%w: Dialect is required (sqlstore.Postgres(), sqlstore.MySQL() or sqlstore.SQLite())", ErrInvalidConfig)
	}
	if c.Completion != Mark && c.Completion != Delete {
		return fmt.Errorf("%w: unknown Completion %d", ErrInvalidConfig, int(c.Completion))
	}
	if c.Lease < 0 {
		return fmt.Errorf("%w: Lease %v is negative", ErrInvalidConfig, c.Lease)
	}
	if err := c.validatePartitions(); err != nil {
		return err
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
	// partitionEvery is Config.PartitionEvery: 0 for a table of one piece.
	partitionEvery time.Duration
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
	s := &Store{mode: cfg.Completion, lease: cfg.Lease, partitionEvery: cfg.PartitionEvery, migrations: migrationFiles}
	s.q = buildQueries(cfg.Dialect, name, cfg.Completion, cfg.DurableCompletion)
	s.versioned = versioned{dialect: cfg.Dialect, table: cfg.Table, name: name, kind: cfg.Completion.String(), identityFrom: identityVersion, vq: &s.q.versionQueries}
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
	if !co.DisableComplete && cfg.Dialect.batchComplete {
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

// Lease is the delivery lease the store was configured with
// ([Config.Lease]); zero without one.
func (s *Store) Lease() time.Duration { return s.lease }

// Dialect returns the store's dialect.
func (s *Store) Dialect() *Dialect { return s.dialect }
