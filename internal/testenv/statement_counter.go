package testenv

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
)

// StatementCounter counts the statements pgx sends to PostgreSQL, by the
// start of their text. It is safe for concurrent use.
type StatementCounter struct {
	mu   sync.Mutex
	seen []Statement
}

// Statement is one statement pgx sent, with its arguments.
type Statement struct {
	SQL  string
	Args []any
}

// TraceQueryStart implements pgx.QueryTracer.
func (c *StatementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.seen = append(c.seen, Statement{SQL: data.SQL, Args: data.Args})
	c.mu.Unlock()
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *StatementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Count returns how many statements starting with prefix were sent.
func (c *StatementCounter) Count(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.seen {
		if strings.HasPrefix(s.SQL, prefix) {
			n++
		}
	}
	return n
}

// Statements returns every statement sent so far, in the order they were
// sent.
func (c *StatementCounter) Statements() []Statement {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Statement(nil), c.seen...)
}

// CountingPostgres opens the test PostgreSQL database with a tracer that
// counts every statement sent on it, closing it when the test ends.
func CountingPostgres(tb testing.TB) (*sqlx.DB, *StatementCounter) {
	tb.Helper()
	Postgres(tb) // skips, or fails under CI=true, when PostgreSQL is not reachable
	cfg, err := pgx.ParseConfig(PostgresDSN())
	if err != nil {
		tb.Fatalf("parse PostgreSQL DSN: %v", err)
	}
	counter := &StatementCounter{}
	cfg.Tracer = counter
	db := sqlx.NewDb(stdlib.OpenDB(*cfg), "pgx")
	tb.Cleanup(func() { _ = db.Close() })
	return db, counter
}
