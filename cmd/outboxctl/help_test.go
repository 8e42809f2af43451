package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const toolHelp = `outboxctl inspects and operates the record tables of the Watermill outbox.

usage: outboxctl [global flags] COMMAND [flags] [ARGS]

Commands:
  status    per topic: pending, oldest pending, abandoned, completed
  list      records in a state, by id, a page at a time
  show      one record with its metadata and payload
  due       make every pending record due for the service's stale resubmitter
  requeue   make abandoned records pending again, due at once
  clean     delete completed records older than AGE
  retire    complete the pending deliveries of a consumer no longer declared
  serve     serve the dashboard of the table over HTTP

Global flags, before or after the command:
  -dialect dialect
    	database dialect: postgres, mysql or sqlite (default: read from the DSN)
  -dsn DSN
    	database DSN (default $OUTBOX_DSN)
  -json
    	print JSON instead of text
  -table table
    	the record table; schema.table for one in a schema (PostgreSQL, MySQL/MariaDB) (default "watermill_outbox")

Examples:
  outboxctl -dsn file:outbox.db status
  outboxctl list -state abandoned -limit 20
  outboxctl show 118 -json
  outboxctl due -dry-run
  outboxctl requeue 118 119
  outboxctl clean -older-than 720h
  outboxctl retire -topic orders -consumer stats
  outboxctl -dsn postgres://localhost/app serve -addr 127.0.0.1:8080

Run 'outboxctl help COMMAND' for a command's flags.
`

const listHelp = `usage: outboxctl list [-state S] [-after ID] [-limit N]

Lists the records in a state by id, -limit at a time, with their attempts, ages,
consumers and last error. When there are more, a last line on stderr gives the
-after of the next page ("next_after" with -json).

Flags:
  -after id
    	list records with an id greater than this
  -limit n
    	list at most n records (default 50)
  -state state
    	records in state: pending, abandoned or completed (default "pending")

Global flags, before or after the command: -dsn DSN, -dialect D, -table T, -json (see 'outboxctl help').

Example:
  outboxctl list -state abandoned -limit 20
`

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"-h"}, {"-help"}, {"help", "help"}} {
		r := outboxctl(t, "", nil, args...)
		assert.Zero(t, r.code, "%v", args)
		assert.Equal(t, toolHelp, r.stdout, "%v", args)
		assert.Empty(t, r.stderr, "%v", args)
	}
	for _, args := range [][]string{{"help", "list"}, {"list", "-h"}, {"list", "-help"}, {"-json", "list", "-state", "abandoned", "-h"}} {
		r := outboxctl(t, "", nil, args...)
		assert.Zero(t, r.code, "%v", args)
		assert.Equal(t, listHelp, r.stdout, "%v", args)
		assert.Empty(t, r.stderr, "%v", args)
	}
}

// TestEveryCommandHasHelp checks that each command's help shows its usage,
// its flags and an example of it.
func TestEveryCommandHasHelp(t *testing.T) {
	t.Parallel()
	flags := map[string][]string{
		"status": nil, "list": {"-state", "-after", "-limit"}, "show": nil,
		"due": {"-dry-run", "-batch"}, "requeue": nil, "clean": {"-older-than", "-batch"},
		"retire": {"-topic", "-consumer"}, "serve": {"-addr", "-actions", "-allow-host"},
	}
	require.Len(t, commands, len(flags))
	for _, cmd := range commands {
		t.Run(cmd.name, func(t *testing.T) {
			t.Parallel()
			help := outboxctl(t, "", nil, "help", cmd.name)
			require.Zero(t, help.code, help.stderr)
			dashH := outboxctl(t, "", nil, cmd.name, "-h")
			require.Zero(t, dashH.code, dashH.stderr)
			assert.Equal(t, help.stdout, dashH.stdout)
			assert.Regexp(t, `^usage: outboxctl `+cmd.name+`\b`, help.stdout)
			assert.Regexp(t, `\nExample:\n  outboxctl (-dsn \S+ )?`+cmd.name+`\b.*\n$`, help.stdout)
			for _, f := range flags[cmd.name] {
				assert.Regexp(t, `\n  `+f+`[ \n]`, help.stdout, "flag %s", f)
			}
			if len(flags[cmd.name]) == 0 {
				assert.NotContains(t, help.stdout, "Flags:")
			}
			assert.Contains(t, help.stdout, "Global flags, before or after the command: -dsn DSN, -dialect D, -table T, -json")
		})
	}
}

func TestUsageMistakes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{nil, "outboxctl: no command\nRun 'outboxctl help' for usage.\n"},
		{[]string{"frobnicate"}, "outboxctl: unknown command \"frobnicate\"\nRun 'outboxctl help' for usage.\n"},
		{[]string{"resubmit", "1"}, "outboxctl: unknown command \"resubmit\"\nRun 'outboxctl help' for usage.\n"},
		{[]string{"help", "frobnicate"}, "outboxctl: no help for unknown command \"frobnicate\"\nRun 'outboxctl help' for usage.\n"},
		{[]string{"-bogus", "status"}, "outboxctl: flag provided but not defined: -bogus\nRun 'outboxctl help' for usage.\n"},
		{[]string{"list", "-bogus"}, "outboxctl: list: flag provided but not defined: -bogus\nRun 'outboxctl help list' for its flags.\n"},
		{[]string{"show"}, "outboxctl: show: expected a record id\nRun 'outboxctl help show' for its flags.\n"},
		{[]string{"show", "abc"}, "outboxctl: show: \"abc\" is not a record id\nRun 'outboxctl help show' for its flags.\n"},
		{[]string{"show", "1", "2"}, "outboxctl: show: expected 1 record id, got 2 arguments\nRun 'outboxctl help show' for its flags.\n"},
		{[]string{"requeue"}, "outboxctl: requeue: expected record ids\nRun 'outboxctl help requeue' for its flags.\n"},
		{[]string{"clean"}, "outboxctl: clean: -older-than is required, e.g. -older-than 720h\nRun 'outboxctl help clean' for its flags.\n"},
		{[]string{"retire", "-topic", "orders"}, "outboxctl: retire: -topic and -consumer are required\nRun 'outboxctl help retire' for its flags.\n"},
		{[]string{"list", "-state", "stuck"}, "outboxctl: list: unknown state \"stuck\" (pending, abandoned or completed)\nRun 'outboxctl help list' for its flags.\n"},
		{[]string{"list", "-limit", "0"}, "outboxctl: list: -limit 0 is not between 1 and 100000\nRun 'outboxctl help list' for its flags.\n"},
		{[]string{"status", "extra"}, "outboxctl: status: takes no arguments (got \"extra\")\nRun 'outboxctl help status' for its flags.\n"},
		{[]string{"status"}, "outboxctl: no DSN: pass -dsn or set OUTBOX_DSN\nRun 'outboxctl help status' for its flags.\n"},
		{[]string{"-dsn", "somewhere", "status"}, "outboxctl: cannot tell the database from the DSN; set -dialect\nRun 'outboxctl help status' for its flags.\n"},
	} {
		r := outboxctl(t, "", nil, tc.args...)
		assert.Equal(t, 2, r.code, "%v", tc.args)
		assert.Equal(t, tc.stderr, r.stderr, "%v", tc.args)
		assert.Empty(t, r.stdout, "%v", tc.args)
	}
}
