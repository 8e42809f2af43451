package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/wmoutbox/outbox/sqlstore"
)

func (c *cli) execute(ctx context.Context) error {
	commands := map[string]func(context.Context, *sqlstore.Store) error{
		"status": c.status, "list": c.list, "show": c.show,
		"replay": c.replay, "resubmit": c.resubmit, "purge": c.purge,
	}
	cmd, ok := commands[c.cmd]
	if !ok {
		return fmt.Errorf("%w: unknown command %q", errUsage, c.cmd)
	}
	store, closeDB, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	return cmd(ctx, store)
}

func (c *cli) fail(err error) {
	fmt.Fprintf(c.errOut, "outboxctl: %v\n", err)
	if errors.Is(err, errUsage) {
		fmt.Fprint(c.errOut, usageText)
	}
}

// flags parses a command's own flags; positional arguments are returned.
func (c *cli) flags(define func(fs *flag.FlagSet)) ([]string, error) {
	fs := flag.NewFlagSet(c.cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	define(fs)
	if err := fs.Parse(c.args); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errUsage, c.cmd, err)
	}
	return fs.Args(), nil
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (c *cli) printTable(header string, rows func(w io.Writer)) error {
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, header)
	rows(w)
	return w.Flush()
}

func (c *cli) status(ctx context.Context, s *sqlstore.Store) error {
	if _, err := c.flags(func(*flag.FlagSet) {}); err != nil {
		return err
	}
	sts, err := s.Status(ctx)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(map[string]any{"table": s.Table(), "completion": s.Completion().String(), "names": sts})
	}
	return c.printTable("NAME\tPENDING\tOLDEST PENDING\tABANDONED\tCOMPLETED", func(w io.Writer) {
		for _, st := range sts {
			fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%d\n", st.Name, st.Pending, age(st.OldestPending), st.Abandoned, st.Completed)
		}
	})
}

func (c *cli) list(ctx context.Context, s *sqlstore.Store) error {
	state, after, limit := string(sqlstore.Pending), int64(0), 50
	if _, err := c.flags(func(fs *flag.FlagSet) {
		fs.StringVar(&state, "state", state, "pending, abandoned or completed")
		fs.Int64Var(&after, "after", 0, "list records with a greater id")
		fs.IntVar(&limit, "limit", limit, "at most this many records")
	}); err != nil {
		return err
	}
	infos, err := s.List(ctx, sqlstore.State(state), after, limit)
	if err != nil {
		return err
	}
	if c.json {
		out := make([]recordJSON, len(infos))
		for i, r := range infos {
			out[i] = toJSON(r, false)
		}
		return c.printJSON(out)
	}
	return c.printTable("ID\tNAME\tUUID\tSTATE\tATTEMPTS\tAGE\tLAST SENT\tCONSUMERS\tLAST ERROR", func(w io.Writer) {
		for _, r := range infos {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s ago\t%s\t%s\n", r.ID, r.Topic, r.UUID, r.State, r.Attempts, age(r.Age), age(r.SinceSent),
				deliveriesLine(r.Deliveries), oneLine(r.LastError, 60))
		}
	})
}

func (c *cli) show(ctx context.Context, s *sqlstore.Store) error {
	args, err := c.flags(func(*flag.FlagSet) {})
	if err != nil {
		return err
	}
	ids, err := parseIDs(args, 1)
	if err != nil {
		return err
	}
	r, err := s.Get(ctx, ids[0])
	if err != nil {
		return err
	}
	j := toJSON(r, true)
	if c.json {
		return c.printJSON(j)
	}
	fmt.Fprintf(c.out, "id:         %d\nname:       %s\nuuid:       %s\nstate:      %s\nattempts:   %d\nage:        %s\nlast sent:  %s ago\nlast error: %s\nmetadata:   %v\npayload:    %s\n",
		r.ID, r.Topic, r.UUID, r.State, r.Attempts, age(r.Age), age(r.SinceSent), r.LastError, map[string]string(r.Metadata), j.Payload)
	for _, d := range r.Deliveries {
		fmt.Fprintf(c.out, "consumer:   %s: %s, %d attempt(s)", d.Consumer, d.State, d.Attempts)
		if d.LastError != "" {
			fmt.Fprintf(c.out, ", last error: %s", oneLine(d.LastError, 200))
		}
		fmt.Fprintln(c.out)
	}
	return nil
}

func (c *cli) replay(ctx context.Context, s *sqlstore.Store) error {
	dryRun, batch := false, 500
	if _, err := c.flags(func(fs *flag.FlagSet) {
		fs.BoolVar(&dryRun, "dry-run", false, "count the pending records without changing them")
		fs.IntVar(&batch, "batch", batch, "records per transaction")
	}); err != nil {
		return err
	}
	bar := newProgress(c.errOut, pendingTotal(ctx, s))
	var after int64
	done := 0
	for {
		ids, err := s.MakeDue(ctx, after, batch, dryRun)
		if err != nil {
			return err
		}
		done += len(ids)
		bar.set(int64(done))
		if len(ids) < batch {
			break
		}
		after = ids[len(ids)-1]
	}
	bar.finish()
	verb := "made due for the service's stale resubmitter"
	if dryRun {
		verb = "would be made due (dry run, nothing changed)"
	}
	if c.json {
		return c.printJSON(map[string]any{"records": done, "dry_run": dryRun})
	}
	fmt.Fprintf(c.out, "%d pending record(s) %s\n", done, verb)
	return nil
}

func (c *cli) resubmit(ctx context.Context, s *sqlstore.Store) error {
	args, err := c.flags(func(*flag.FlagSet) {})
	if err != nil {
		return err
	}
	ids, err := parseIDs(args, -1)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := s.RequeueLater(ctx, id); err != nil {
			return err
		}
	}
	if c.json {
		return c.printJSON(map[string]any{"resubmitted": ids})
	}
	fmt.Fprintf(c.out, "%d abandoned record(s) pending again, due for the service's stale resubmitter\n", len(ids))
	return nil
}

func (c *cli) purge(ctx context.Context, s *sqlstore.Store) error {
	var olderThan time.Duration
	batch := 1000
	if _, err := c.flags(func(fs *flag.FlagSet) {
		fs.DurationVar(&olderThan, "older-than", 0, "delete records completed longer ago than this, e.g. 720h (required)")
		fs.IntVar(&batch, "batch", batch, "records per DELETE")
	}); err != nil {
		return err
	}
	if olderThan <= 0 {
		return fmt.Errorf("%w: purge needs -older-than, e.g. -older-than 720h", errUsage)
	}
	total := 0
	for {
		n, err := s.PurgeCompleted(ctx, olderThan, batch)
		total += n
		if err != nil {
			return err
		}
		if n < batch {
			break
		}
	}
	if c.json {
		return c.printJSON(map[string]any{"deleted": total})
	}
	fmt.Fprintf(c.out, "%d completed record(s) deleted\n", total)
	return nil
}

func parseIDs(args []string, want int) ([]int64, error) {
	if len(args) == 0 || (want > 0 && len(args) != want) {
		return nil, fmt.Errorf("%w: expected a record id", errUsage)
	}
	ids := make([]int64, len(args))
	for i, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id < 1 {
			return nil, fmt.Errorf("%w: %q is not a record id", errUsage, a)
		}
		ids[i] = id
	}
	return ids, nil
}
