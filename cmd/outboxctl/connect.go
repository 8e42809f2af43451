package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"   // MySQL/MariaDB driver; its DSN parser names the server without the password
	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL driver
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // SQLite driver

	"github.com/wmoutbox/outbox/sqlstore"
)

// connectTimeout bounds the first contact with the database.
const connectTimeout = 15 * time.Second

// dialectOf names the dialect and the database/sql driver of a DSN.
func dialectOf(dsn, name string) (*sqlstore.Dialect, string, error) {
	if name == "" {
		switch {
		case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
			name = "postgres"
		case strings.HasPrefix(dsn, "file:"), strings.HasSuffix(dsn, ".db"), strings.HasSuffix(dsn, ".sqlite"),
			strings.Contains(dsn, ".db?"), strings.Contains(dsn, ".sqlite?"):
			name = "sqlite"
		case strings.Contains(dsn, "@tcp("), strings.Contains(dsn, "@unix("):
			name = "mysql"
		default:
			return nil, "", usagef("cannot tell the database from the DSN; set -dialect")
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
	return nil, "", usagef("unknown dialect %q (postgres, mysql or sqlite)", name)
}

// open connects and returns the store of the table, in the completion mode
// the table was created with.
func (c *cli) open(ctx context.Context) (*sqlstore.Store, func(), error) {
	dsn := c.dsn
	if dsn == "" {
		dsn = c.getenv("OUTBOX_DSN")
	}
	if dsn == "" {
		return nil, nil, usagef("no DSN: pass -dsn or set OUTBOX_DSN")
	}
	d, driver, err := dialectOf(dsn, c.dialect)
	if err != nil {
		return nil, nil, err
	}
	// A bad -table is the caller's mistake, found before connecting.
	if _, err := sqlstore.New(sqlstore.Config{Dialect: d, Table: c.table}); errors.Is(err, sqlstore.ErrInvalidTable) {
		return nil, nil, usagef("-table: %v", err)
	}
	where := d.Name() + " at " + safeDSN(d.Name(), dsn)
	if d.Name() == "sqlite" {
		if dsn, err = existingSQLite(dsn); err != nil {
			return nil, nil, err
		}
	}
	db, err := sqlx.Open(driver, dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot connect to %s: %w", where, err)
	}
	closeDB := func() { _ = db.Close() }
	if d.Name() == "sqlite" {
		db.SetMaxOpenConns(1)
	}
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	err = db.PingContext(pingCtx)
	cancel()
	if err != nil {
		closeDB()
		return nil, nil, fmt.Errorf("cannot connect to %s: %w", where, err)
	}
	s, err := sqlstore.OpenTable(ctx, db, d, c.table)
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	return s, closeDB, nil
}

// existingSQLite returns a DSN that opens the SQLite file of dsn without
// creating it (mode=rw), or an error naming the file when it does not
// exist: a mistyped path must not leave an empty database behind.
func existingSQLite(dsn string) (string, error) {
	file, query, uri := sqliteFile(dsn)
	params, _ := url.ParseQuery(query)
	if file == "" || file == ":memory:" || params.Get("mode") == "memory" {
		return dsn, nil
	}
	if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("sqlite database file %q does not exist (outboxctl never creates one; check -dsn)", file)
	}
	if params.Has("mode") {
		return dsn, nil
	}
	if !uri {
		// SQLite reads mode only from a file: URI; the driver's own
		// parameters (_pragma…) work in both forms.
		dsn = "file:" + strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(file) + "?" + query
	}
	switch {
	case !strings.Contains(dsn, "?"):
		return dsn + "?mode=rw", nil
	case strings.HasSuffix(dsn, "?"), strings.HasSuffix(dsn, "&"):
		return dsn + "mode=rw", nil
	}
	return dsn + "&mode=rw", nil
}

// sqliteFile splits a SQLite DSN into its file and its query, and says
// whether it is a file: URI.
func sqliteFile(dsn string) (file, query string, uri bool) {
	rest, uri := strings.CutPrefix(dsn, "file:")
	name, query, _ := strings.Cut(rest, "?")
	if !uri {
		return name, query, false
	}
	name, _, _ = strings.Cut(name, "#")
	if authority, ok := strings.CutPrefix(name, "//"); ok { // file://host/path
		if i := strings.IndexByte(authority, '/'); i >= 0 {
			name = authority[i:]
		} else {
			name = ""
		}
	}
	if unescaped, err := url.PathUnescape(name); err == nil {
		name = unescaped
	}
	return name, query, true
}

// safeDSN is the part of a DSN that may be printed: the server, the user
// and the database, never the password or the parameters (which may hold
// one).
func safeDSN(dialect, dsn string) string {
	switch dialect {
	case "sqlite":
		file, _, _ := sqliteFile(dsn)
		return file
	case "mysql":
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return "(DSN not shown)"
		}
		return fmt.Sprintf("%s@%s(%s)/%s", cfg.User, cfg.Net, cfg.Addr, cfg.DBName)
	case "postgres":
		if strings.Contains(dsn, "://") {
			u, err := url.Parse(dsn)
			if err != nil {
				return "(DSN not shown)"
			}
			if u.User != nil {
				u.User = url.User(u.User.Username())
			}
			u.RawQuery, u.Fragment = "", ""
			return u.String()
		}
		var kept []string // keyword/value form: host=… user=… password=…
		for _, kv := range strings.Fields(dsn) {
			switch k, _, _ := strings.Cut(kv, "="); k {
			case "host", "port", "user", "dbname":
				kept = append(kept, kv)
			}
		}
		return strings.Join(kept, " ")
	}
	return "(DSN not shown)"
}
