package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	_ "github.com/go-sql-driver/mysql" // MySQL/MariaDB driver
	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL driver
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // SQLite driver

	"github.com/wmoutbox/outbox/sqlstore"
)

// errUsage is wrapped by command-line mistakes.
var errUsage = errors.New("usage")

const usageText = `usage: outboxctl [-dsn DSN] [-dialect postgres|mysql|sqlite] [-table T] [-json] COMMAND [ARGS]
commands: status, list, show ID, replay, resubmit ID..., purge -older-than AGE
`

// cli is one invocation.
type cli struct {
	dsn, dialect, table string
	json                bool
	cmd                 string
	args                []string
	out, errOut         io.Writer
}

func parseGlobal(args []string, stderr io.Writer, getenv func(string) string) (*cli, error) {
	c := &cli{}
	fs := flag.NewFlagSet("outboxctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usageText); fs.PrintDefaults() }
	fs.StringVar(&c.dsn, "dsn", getenv("OUTBOX_DSN"), "database DSN (default $OUTBOX_DSN)")
	fs.StringVar(&c.dialect, "dialect", "", "postgres, mysql or sqlite (default: read from the DSN)")
	fs.StringVar(&c.table, "table", sqlstore.DefaultTable, "record table")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of a table")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return nil, errUsage
	}
	c.cmd, c.args = fs.Arg(0), fs.Args()[1:]
	return c, nil
}

// dialectOf names the dialect and the database/sql driver of a DSN.
func dialectOf(dsn, name string) (sqlstore.Dialect, string, error) {
	if name == "" {
		switch {
		case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
			name = "postgres"
		case strings.HasPrefix(dsn, "file:"), strings.HasSuffix(dsn, ".db"), strings.HasSuffix(dsn, ".sqlite"):
			name = "sqlite"
		case strings.Contains(dsn, "@tcp("), strings.Contains(dsn, "@unix("):
			name = "mysql"
		default:
			return nil, "", fmt.Errorf("%w: cannot tell the database from the DSN; set -dialect", errUsage)
		}
	}
	switch name {
	case "postgres":
		return sqlstore.Postgres(), "pgx", nil
	case "mysql":
		return sqlstore.MySQL(), "mysql", nil
	case "sqlite":
		return sqlstore.SQLite(), "sqlite", nil
	}
	return nil, "", fmt.Errorf("%w: unknown dialect %q (postgres, mysql or sqlite)", errUsage, name)
}

// open connects and returns the store of the table, in the completion mode
// the table was created with.
func (c *cli) open(ctx context.Context) (*sqlstore.Store, func(), error) {
	if c.dsn == "" {
		return nil, nil, fmt.Errorf("%w: no DSN: pass -dsn or set OUTBOX_DSN", errUsage)
	}
	d, driver, err := dialectOf(c.dsn, c.dialect)
	if err != nil {
		return nil, nil, err
	}
	db, err := sqlx.Open(driver, c.dsn)
	if err != nil {
		return nil, nil, err
	}
	closeDB := func() { _ = db.Close() }
	mode, err := completionOf(ctx, db, c.table)
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	s, err := sqlstore.New(sqlstore.Config{Dialect: d, Table: c.table, Completion: mode, DB: db})
	if err == nil {
		err = s.Verify(ctx)
	}
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	return s, closeDB, nil
}

// completionOf reads the completion mode the table was created with.
func completionOf(ctx context.Context, db *sqlx.DB, table string) (sqlstore.Completion, error) {
	var mode string
	err := db.GetContext(ctx, &mode, db.Rebind("SELECT completion FROM "+sqlstore.VersionTable+" WHERE table_name = ?"), table)
	if err != nil {
		return 0, fmt.Errorf("reading the table %q in %s (was it created with Store.Migrate?): %w", table, sqlstore.VersionTable, err)
	}
	if mode == sqlstore.Delete.String() {
		return sqlstore.Delete, nil
	}
	return sqlstore.Mark, nil
}
