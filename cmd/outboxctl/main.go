// Command outboxctl inspects and operates the record tables of the outbox
// plugin for Watermill, on PostgreSQL, MySQL/MariaDB and SQLite.
//
//	go install github.com/wmoutbox/outbox/cmd/outboxctl@latest
//
//	outboxctl [-dsn DSN] [-dialect D] [-table T] [-json] COMMAND [ARGS]
//
// Commands:
//
//	status                           per name: pending, oldest pending age, abandoned, completed
//	list [-state S] [-after ID] [-limit N]
//	                                 records in a state (pending, abandoned, completed)
//	show ID                          one record with its payload and metadata
//	replay [-dry-run] [-batch N]     make every pending record due for the service's
//	                                 stale resubmitter, with progress on stderr
//	resubmit ID...                   make abandoned records pending and due again
//	purge -older-than AGE [-batch N] delete completed records older than AGE
//
// The DSN comes from -dsn or the OUTBOX_DSN environment variable; the dialect
// is read from it (postgres:// URLs, MySQL's user@tcp(host)/db form, and
// file: or *.db paths for SQLite) unless -dialect names it. The table's
// completion mode is read from the schema version table. The tool never
// publishes: replay and resubmit mark records due, and the running service
// sends them (outbox.StaleResubmitter, or startup replay).
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run is the whole command, apart from the process: tests call it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c, err := parseGlobal(args, stderr, getenv)
	if err != nil {
		return 2
	}
	c.out, c.errOut = stdout, stderr
	if err := c.execute(ctx); err != nil {
		c.fail(err)
		return 1
	}
	return 0
}
