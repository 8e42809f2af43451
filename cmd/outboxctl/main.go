// Command outboxctl inspects and operates the record tables of the outbox
// plugin for Watermill, on PostgreSQL, MySQL/MariaDB and SQLite.
//
//	go install github.com/wmoutbox/outbox/cmd/outboxctl@latest
//
//	outboxctl [-dsn DSN] [-dialect D] [-table T] [-json] COMMAND [FLAGS] [ARGS]
//
// Commands:
//
//	status                             per topic: pending, oldest pending, abandoned, completed
//	list [-state S] [-after ID] [-limit N]
//	                                   records in a state, by id, a page at a time
//	show ID                            one record with its metadata and payload
//	due [-dry-run] [-batch N]          make every pending record due for the service's
//	                                   stale resubmitter, with progress on stderr
//	requeue ID...                      make abandoned records pending again, due at once
//	clean -older-than AGE [-batch N]   delete completed records older than AGE
//	retire -topic T -consumer C        complete the pending deliveries of a consumer
//	                                   no longer declared (removed, or renamed)
//	help [COMMAND]                     the commands, or one command's flags and an example
//
// The global flags may come before or after the command. The DSN comes from
// -dsn or the OUTBOX_DSN environment variable; the dialect is read from it
// (postgres:// URLs, MySQL's user@tcp(host)/db form, and file: or *.db paths
// for SQLite) unless -dialect names it. A SQLite file that does not exist is
// an error, never created. -table names the record table, schema.table for
// one in a schema on PostgreSQL or MySQL/MariaDB (tenant_a.watermill_outbox);
// a missing schema is an error that names it. The table's completion mode is
// read from the schema version table. The tool never publishes: due and
// requeue mark records due, and the running service sends them
// (outbox.StaleResubmitter, or startup replay).
//
// Exit status: 0 on success, 1 when a command fails, 2 for a usage mistake.
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

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// run is the whole command, apart from the process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{out: stdout, errOut: stderr, getenv: getenv}
	return c.run(ctx, args)
}
