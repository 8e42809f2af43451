package outboxtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"

	"github.com/wmoutbox/outbox/recordstore"
)

// ErrNoDatabase is returned by the statements of a [Tx], which has no
// database to run them on.
var ErrNoDatabase = errors.New("outboxtest: Tx runs no SQL")

// Tx is a stand-in transaction for tests of handlers that take a
// [recordstore.Tx] and save an [Inbox] entry through it: its Commit and
// Rollback settle what the in-memory inboxes hold for it. It has no
// database: ExecContext and QueryContext return [ErrNoDatabase], and
// QueryRowContext a row whose Scan does. Commit or Rollback end it; after
// that both return sql.ErrTxDone. Its zero value is ready to use.
type Tx struct {
	mu    sync.Mutex
	ended bool
	// settle are the inboxes' callbacks, run when the transaction ends.
	settle []func(commit bool)
}

var _ recordstore.Tx = (*Tx)(nil)

// NewTx returns a transaction that has not ended.
func NewTx() *Tx { return &Tx{} }

// hold registers fn to run when the transaction ends; it fails with
// sql.ErrTxDone once it has.
func (tx *Tx) hold(fn func(commit bool)) error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.ended {
		return sql.ErrTxDone
	}
	tx.settle = append(tx.settle, fn)
	return nil
}

// Commit makes the entries saved through tx handled.
func (tx *Tx) Commit() error { return tx.end(true) }

// Rollback drops the entries saved through tx.
func (tx *Tx) Rollback() error { return tx.end(false) }

func (tx *Tx) end(commit bool) error {
	tx.mu.Lock()
	if tx.ended {
		tx.mu.Unlock()
		return sql.ErrTxDone
	}
	tx.ended = true
	settle := tx.settle
	tx.settle = nil
	tx.mu.Unlock()
	for _, fn := range settle {
		fn(commit)
	}
	return nil
}

// ExecContext returns [ErrNoDatabase].
func (tx *Tx) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, ErrNoDatabase
}

// QueryContext returns [ErrNoDatabase].
func (tx *Tx) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, ErrNoDatabase
}

// QueryRowContext returns a row whose Scan returns [ErrNoDatabase].
func (tx *Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return noDatabase.QueryRowContext(ctx, query, args...)
}

// noDatabase is a pool whose every statement fails with ErrNoDatabase: the
// only way to make a *sql.Row that carries an error.
var noDatabase = sql.OpenDB(noConnector{})

type noConnector struct{}

func (noConnector) Connect(context.Context) (driver.Conn, error) { return nil, ErrNoDatabase }

func (noConnector) Driver() driver.Driver { return noDriver{} }

type noDriver struct{}

func (noDriver) Open(string) (driver.Conn, error) {
	return nil, fmt.Errorf("open: %w", ErrNoDatabase)
}
