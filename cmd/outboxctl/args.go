package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/wmoutbox/outbox/sqlstore"
)

// usageError is a command-line mistake; it exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

func isUsage(err error) bool {
	var u *usageError
	return errors.As(err, &u)
}

// errHelp asks for help; it is printed on stdout and exits with status 0.
var errHelp = errors.New("help")

// cli is one invocation: the global flags, the chosen command and its
// flags, and where output goes.
type cli struct {
	dsn, dialect, table string
	json                bool

	// The flags of the commands; each invocation runs one command.
	state      string
	after      int64
	limit      int
	dryRun     bool
	batch      int
	olderThan  time.Duration
	topic      string
	consumer   string
	addr       string
	actions    bool
	allowHosts hostList
	inbox      string

	cmd         *command
	args        []string
	out, errOut io.Writer
	getenv      func(string) string
}

// hostList is the value of a flag that adds a host name each time it is
// given.
type hostList []string

func (h *hostList) String() string { return strings.Join(*h, ",") }

func (h *hostList) Set(name string) error {
	if name == "" {
		return errors.New("empty host name")
	}
	*h = append(*h, name)
	return nil
}

// globalFlags defines the flags every command accepts on fs.
func (c *cli) globalFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.dsn, "dsn", c.dsn, "database `DSN` (default $OUTBOX_DSN)")
	fs.StringVar(&c.dialect, "dialect", c.dialect, "database `dialect`: postgres, mysql or sqlite (default: read from the DSN)")
	fs.StringVar(&c.table, "table", c.table, "the record `table`; schema.table for one in a schema (PostgreSQL, MySQL/MariaDB)")
	fs.BoolVar(&c.json, "json", c.json, "print JSON instead of text")
}

// parse reads the global flags, the command, and the command's flags and
// arguments. The global flags may come before or after the command.
func (c *cli) parse(args []string) error {
	c.table = sqlstore.DefaultTable
	global := newFlagSet("outboxctl")
	c.globalFlags(global)
	if err := global.Parse(args); err != nil {
		return flagError(err, "")
	}
	if global.NArg() == 0 {
		return usagef("no command")
	}
	name, rest := global.Arg(0), global.Args()[1:]
	if name == "help" {
		return c.parseHelp(rest)
	}
	cmd := lookup(name)
	if cmd == nil {
		return usagef("unknown command %q", name)
	}
	c.cmd = cmd
	fs := newFlagSet(cmd.name)
	c.globalFlags(fs)
	cmd.define(c, fs)
	positional, err := parseAnywhere(fs, rest)
	if err != nil {
		return flagError(err, cmd.name)
	}
	c.args = positional
	return nil
}

// parseHelp reads the arguments of the help command.
func (c *cli) parseHelp(args []string) error {
	switch {
	case len(args) == 0:
		return errHelp
	case len(args) > 1:
		return usagef("help takes one command")
	}
	if args[0] == "help" {
		return errHelp
	}
	if c.cmd = lookup(args[0]); c.cmd == nil {
		return usagef("no help for unknown command %q", args[0])
	}
	return errHelp
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors and help are printed by run
	return fs
}

// flagError turns an error of the flag package into a usage error, or a
// request for help.
func flagError(err error, cmd string) error {
	if errors.Is(err, flag.ErrHelp) {
		return errHelp
	}
	if cmd != "" {
		return usagef("%s: %v", cmd, err)
	}
	return usagef("%v", err)
}

// parseAnywhere parses flags wherever they are among args, as people type
// them (`show 12 -json`), and returns the other arguments in order. After
// "--" everything is an argument.
func parseAnywhere(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// usageHint follows a usage mistake on stderr.
func usageHint(cmd *command) string {
	if cmd != nil {
		return fmt.Sprintf("Run 'outboxctl help %s' for its flags.\n", cmd.name)
	}
	return "Run 'outboxctl help' for usage.\n"
}

// printHelp prints the help of the command, or of the tool when cmd is nil.
func (c *cli) printHelp(w io.Writer, cmd *command) {
	if cmd == nil {
		c.printToolHelp(w)
		return
	}
	fmt.Fprintf(w, "usage: outboxctl %s\n\n%s\n", strings.TrimSpace(cmd.name+" "+cmd.synopsis), cmd.doc)
	own := newFlagSet(cmd.name)
	cmd.define(&cli{}, own)
	if hasFlags(own) {
		fmt.Fprintln(w, "\nFlags:")
		own.SetOutput(w)
		own.PrintDefaults()
	}
	fmt.Fprintln(w, "\nGlobal flags, before or after the command: -dsn DSN, -dialect D, -table T, -json (see 'outboxctl help').")
	fmt.Fprintf(w, "\nExample:\n  %s\n", cmd.example)
}

func (c *cli) printToolHelp(w io.Writer) {
	fmt.Fprint(w, `outboxctl inspects and operates the record tables of the Watermill outbox.

usage: outboxctl [global flags] COMMAND [flags] [ARGS]

Commands:
`)
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", cmd.name, cmd.summary)
	}
	fmt.Fprintln(w, "\nGlobal flags, before or after the command:")
	global := newFlagSet("outboxctl")
	(&cli{table: sqlstore.DefaultTable}).globalFlags(global)
	global.SetOutput(w)
	global.PrintDefaults()
	fmt.Fprintln(w, "\nExamples:")
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %s\n", cmd.example)
	}
	fmt.Fprintln(w, "\nRun 'outboxctl help COMMAND' for a command's flags.")
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}
