package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/wmoutbox/outbox"
)

// DefaultTable is the table name used when Config.Table is empty.
const DefaultTable = "watermill_outbox"

// Config configures a [Store].
type Config struct {
	// Dialect is the database's dialect. Required.
	Dialect Dialect
	// Table is the record table, a plain identifier. Defaults to
	// "watermill_outbox".
	Table string
	// Completion is what happens to a handled record. Defaults to [Mark].
	Completion Completion
	// DB is the connection pool. It may be nil and attached later with
	// [Store.Attach].
	DB *sqlx.DB
	// Lease turns on the delivery lease: CheckPending claims the pending
	// record for this long, by the database clock, and a second copy of the
	// message delivered meanwhile gets [outbox.ErrLeased] (the middleware
	// nacks it) instead of running the handler at the same moment. Choose
	// it longer than the longest handler run: a handler that outlives its
	// lease may overlap a redelivery. A crashed handler's lease runs out and
	// the record can be claimed again. Defaults to 0, no lease.
	Lease time.Duration
}

func (c *Config) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultTable
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
	return validateTable(c.Table)
}

// Store is an [outbox.Store] over one SQL table.
type Store struct {
	dialect Dialect
	table   string
	mode    Completion
	lease   time.Duration
	q       *queries
	// att is the attached pool; probeMu serializes probing it.
	att     atomic.Pointer[attachment]
	probeMu sync.Mutex
	// migrations holds migrations/<dialect>/NNN_name.sql.
	migrations fs.FS
}

var _ outbox.Store = (*Store)(nil)

// New returns a store for the table; it does not touch the database. Call
// [Store.Migrate] to create the table.
func New(cfg Config) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{dialect: cfg.Dialect, table: cfg.Table, mode: cfg.Completion, lease: cfg.Lease, migrations: migrationFiles}
	s.q = buildQueries(cfg.Dialect, cfg.Table, cfg.Completion)
	if cfg.DB != nil {
		s.Attach(cfg.DB)
	}
	return s, nil
}

// Table returns the table name.
func (s *Store) Table() string { return s.table }

// Completion returns what the store does with handled records.
func (s *Store) Completion() Completion { return s.mode }

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

func (s *Store) fail(op string, err error) error {
	return &TableError{Table: s.table, Op: op, Err: s.dialect.convertError(err)}
}

// Insert implements [outbox.Store].
func (s *Store) Insert(ctx context.Context, records []outbox.Record) error {
	if len(records) == 0 {
		return nil
	}
	db, d, err := s.bound(ctx)
	if err != nil {
		return err
	}
	if err := d.insert(ctx, db, s.q, records); err != nil {
		if errors.Is(err, ErrInvalidRecord) {
			return err
		}
		return s.fail("insert", err)
	}
	return nil
}

// CheckPending implements [outbox.Store]. With a [Config.Lease] it claims
// the record, returning [outbox.ErrLeased] while another delivery holds it;
// see claim.
func (s *Store) CheckPending(ctx context.Context, id int64) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	if s.lease > 0 {
		return s.claim(ctx, db, id)
	}
	return s.checkPending(ctx, db, id)
}

// checkPending reads whether the record is pending.
func (s *Store) checkPending(ctx context.Context, db *sqlx.DB, id int64) error {
	var one int
	switch err := db.QueryRowContext(ctx, s.q.checkPending, id).Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
		return outbox.ErrNotPending
	case err != nil:
		return s.fail("check pending", err)
	}
	return nil
}

// Complete implements [outbox.Store].
func (s *Store) Complete(ctx context.Context, id int64) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	res, err := db.ExecContext(ctx, s.q.complete, id)
	if err != nil {
		return s.fail("complete", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return s.fail("complete", err)
	}
	if n == 0 {
		return outbox.ErrNotPending
	}
	return nil
}

type recordRow struct {
	ID       int64  `db:"id"`
	Topic    string `db:"topic"`
	UUID     string `db:"uuid"`
	Payload  []byte `db:"payload"`
	Metadata string `db:"metadata"`
}

// PendingAfter implements [outbox.Store].
func (s *Store) PendingAfter(ctx context.Context, topic string, afterID int64, limit int) ([]outbox.Record, error) {
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	var rows []recordRow
	if err := db.SelectContext(ctx, &rows, s.q.pendingAfter, topic, afterID, limit); err != nil {
		return nil, s.fail("read pending", err)
	}
	out := make([]outbox.Record, len(rows))
	for i, r := range rows {
		md, err := decodeMetadata(r.Metadata)
		if err != nil {
			return nil, s.fail("read pending", fmt.Errorf("record %d: %w", r.ID, err))
		}
		payload := r.Payload
		if payload == nil {
			payload = []byte{}
		}
		out[i] = outbox.Record{ID: r.ID, Topic: r.Topic, UUID: r.UUID, Payload: payload, Metadata: md}
	}
	return out, nil
}
