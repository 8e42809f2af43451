package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/wmoutbox/outbox/sqlstore"
)

// command is one of outboxctl's commands.
type command struct {
	name string
	// synopsis shows its flags and arguments; summary is its line in the
	// list of commands; doc says what it does; example is one invocation.
	synopsis, summary, doc, example string
	// define adds the command's own flags to fs, bound to c.
	define func(c *cli, fs *flag.FlagSet)
	run    func(c *cli, ctx context.Context, s *sqlstore.Store) error
}

func noFlags(*cli, *flag.FlagSet) {}

var commands = []*command{
	{
		name: "status", summary: "per topic: pending, oldest pending, abandoned, completed",
		doc: "Counts the records of each topic by state, with the age of the oldest pending one; then,\n" +
			"for each remote consumer, its deliveries awaiting confirmation and the age of the oldest.",
		example: "outboxctl -dsn file:outbox.db status",
		define:  noFlags, run: (*cli).status,
	},
	{
		name: "list", synopsis: "[-state S] [-after ID] [-limit N]", summary: "records in a state, by id, a page at a time",
		doc: "Lists the records in a state by id, -limit at a time, with their attempts, ages,\n" +
			"consumers and last error. When there are more, a last line on stderr gives the\n" +
			"-after of the next page (\"next_after\" with -json).",
		example: "outboxctl list -state abandoned -limit 20",
		define: func(c *cli, fs *flag.FlagSet) {
			fs.StringVar(&c.state, "state", string(sqlstore.Pending), "records in `state`: pending, abandoned or completed")
			fs.Int64Var(&c.after, "after", 0, "list records with an `id` greater than this")
			fs.IntVar(&c.limit, "limit", 50, "list at most `n` records")
		},
		run: (*cli).list,
	},
	{
		name: "show", synopsis: "ID", summary: "one record with its metadata and payload",
		doc:     "Shows one record: its state, attempts, ages, last error, metadata, payload and\nper-consumer deliveries.",
		example: "outboxctl show 118 -json",
		define:  noFlags, run: (*cli).show,
	},
	{
		name: "due", synopsis: "[-dry-run] [-batch N]", summary: "make every pending record due for the service's stale resubmitter",
		doc: "Marks every pending record as due, so that the running service's stale resubmitter\n" +
			"sends it at its next round (or its next startup replay does). Progress goes to stderr.\n" +
			"It never publishes.",
		example: "outboxctl due -dry-run",
		define: func(c *cli, fs *flag.FlagSet) {
			fs.BoolVar(&c.dryRun, "dry-run", false, "count the pending records without changing them")
			fs.IntVar(&c.batch, "batch", 500, "change `n` records per transaction")
		},
		run: (*cli).due,
	},
	{
		name: "requeue", synopsis: "ID...", summary: "make abandoned records pending again, due at once",
		doc: "Makes abandoned records pending again with their attempts reset, due at once for the\n" +
			"service's stale resubmitter. It never publishes.",
		example: "outboxctl requeue 118 119",
		define:  noFlags, run: (*cli).requeue,
	},
	{
		name: "clean", synopsis: "-older-than AGE [-batch N]", summary: "delete completed records older than AGE",
		doc: "Deletes completed records (of a marking table) completed longer ago than AGE, as the\n" +
			"service's cleaner does.",
		example: "outboxctl clean -older-than 720h",
		define: func(c *cli, fs *flag.FlagSet) {
			fs.DurationVar(&c.olderThan, "older-than", 0, "delete records completed longer ago than `AGE`, e.g. 720h (required)")
			fs.IntVar(&c.batch, "batch", 1000, "delete `n` records per statement")
		},
		run: (*cli).clean,
	},
	{
		name: "retire", synopsis: "-topic T -consumer C", summary: "complete the pending deliveries of a consumer no longer declared",
		doc: "Completes every pending delivery of a consumer to a topic's records, as if it had handled\n" +
			"them, and completes each record none of whose deliveries is left pending: for a consumer\n" +
			"removed from Tracked.Consumers, or the old name of a renamed one, which the service\n" +
			"reports at start. It refuses, exiting 1, a consumer that the latest start of a service\n" +
			"on the table declared: redeploy the service without it first.",
		example: "outboxctl retire -topic orders -consumer stats",
		define: func(c *cli, fs *flag.FlagSet) {
			fs.StringVar(&c.topic, "topic", "", "the tracked `topic` (required)")
			fs.StringVar(&c.consumer, "consumer", "", "the retired `consumer`, a handler name (required)")
		},
		run: (*cli).retire,
	},
	{
		name: "serve", synopsis: "[-addr HOST:PORT] [-actions] [-allow-host NAME]... [-inbox TABLE]", summary: "serve the dashboard of the table over HTTP",
		doc: "Serves the outboxui dashboard of the table: per topic and consumer the backlog, its\n" +
			"last hour as a chart, the records and each record's page. With -actions the pages can\n" +
			"requeue, make due and retire, as the commands do; retire asks first. It has no\n" +
			"authentication: keep -addr on the loopback (the default) or behind one. It answers only\n" +
			"requests for its listen address and the loopback names (localhost, 127.0.0.1, [::1],\n" +
			"with its port), and for the names of -allow-host: any other Host gets 421, so that a\n" +
			"page of another site cannot reach it under a name of its own. With -inbox it also shows\n" +
			"the latest entries of the service's inbox table, each with the sender that sent it. It\n" +
			"runs until interrupted.",
		example: "outboxctl -dsn postgres://localhost/app serve -addr 127.0.0.1:8080",
		define: func(c *cli, fs *flag.FlagSet) {
			fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "listen on `host:port`")
			fs.BoolVar(&c.actions, "actions", false, "turn on the pages' actions (requeue, make due, retire)")
			fs.Var(&c.allowHosts, "allow-host", "also answer requests for `name` (with the port, or without it and with the listen port); repeat it for more")
			fs.StringVar(&c.inbox, "inbox", "", "also show the inbox `table` of the service (sqlstore.Inbox), on the same database")
		},
		run: (*cli).serve,
	},
}

func lookup(name string) *command {
	for _, cmd := range commands {
		if cmd.name == name {
			return cmd
		}
	}
	return nil
}

// run parses the arguments and runs the command, and returns the exit
// status.
func (c *cli) run(ctx context.Context, args []string) int {
	switch err := c.parse(args); {
	case errors.Is(err, errHelp):
		c.printHelp(c.out, c.cmd)
		return exitOK
	case err != nil:
		fmt.Fprintf(c.errOut, "outboxctl: %v\n%s", err, usageHint(c.cmd))
		return exitUsage
	}
	err := c.execute(ctx)
	switch {
	case isUsage(err):
		fmt.Fprintf(c.errOut, "outboxctl: %v\n%s", err, usageHint(c.cmd))
		return exitUsage
	case err != nil:
		fmt.Fprintf(c.errOut, "outboxctl: %v\n", err)
		return exitFail
	}
	return exitOK
}

func (c *cli) execute(ctx context.Context) error {
	if err := c.checkArgs(); err != nil {
		return usagef("%s: %v", c.cmd.name, err)
	}
	store, closeDB, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	return c.cmd.run(c, ctx, store)
}

// checkArgs finds the mistakes that need no database.
func (c *cli) checkArgs() error {
	switch c.cmd.name {
	case "show":
		_, err := parseIDs(c.args, 1)
		return err
	case "requeue":
		_, err := parseIDs(c.args, -1)
		return err
	case "list":
		switch sqlstore.State(c.state) {
		case sqlstore.Pending, sqlstore.Abandoned, sqlstore.Completed:
		default:
			return usagef("unknown state %q (pending, abandoned or completed)", c.state)
		}
		if c.limit < 1 || c.limit > 100000 {
			return usagef("-limit %d is not between 1 and 100000", c.limit)
		}
	case "clean":
		if c.olderThan <= 0 {
			return usagef("-older-than is required, e.g. -older-than 720h")
		}
	case "retire":
		if c.topic == "" || c.consumer == "" {
			return usagef("-topic and -consumer are required")
		}
	}
	if c.batch < 0 || (c.batch == 0 && (c.cmd.name == "due" || c.cmd.name == "clean")) {
		return usagef("-batch %d must be positive", c.batch)
	}
	if len(c.args) > 0 && c.cmd.name != "show" && c.cmd.name != "requeue" {
		return usagef("takes no arguments (got %q)", c.args[0])
	}
	return nil
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printTable aligns the tab-separated rows under the header, with no
// spaces at the end of a line whose last cells are empty.
func (c *cli) printTable(header string, rows func(w io.Writer)) error {
	var b bytes.Buffer
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, header)
	rows(w)
	if err := w.Flush(); err != nil {
		return err
	}
	var out strings.Builder
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		out.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	_, err := io.WriteString(c.out, out.String())
	return err
}

func parseIDs(args []string, want int) ([]int64, error) {
	switch {
	case len(args) == 0 && want == 1:
		return nil, usagef("expected a record id")
	case len(args) == 0:
		return nil, usagef("expected record ids")
	case want > 0 && len(args) != want:
		return nil, usagef("expected %d record id, got %d arguments", want, len(args))
	}
	ids := make([]int64, len(args))
	for i, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id < 1 {
			return nil, usagef("%q is not a record id", a)
		}
		ids[i] = id
	}
	return ids, nil
}
