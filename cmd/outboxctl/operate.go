package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func (c *cli) due(ctx context.Context, s *sqlstore.Store) error {
	bar := newProgress(c.errOut, pendingTotal(ctx, s))
	var after int64
	done := 0
	for {
		ids, err := s.Operator().MakeDue(ctx, after, c.batch, c.dryRun)
		if err != nil {
			return err
		}
		done += len(ids)
		bar.set(int64(done))
		if len(ids) < c.batch {
			break
		}
		after = ids[len(ids)-1]
	}
	bar.finish()
	if c.json {
		return c.printJSON(map[string]any{"records": done, "dry_run": c.dryRun})
	}
	verb := "made due for the service's stale resubmitter"
	if c.dryRun {
		verb = "would be made due (dry run, nothing changed)"
	}
	fmt.Fprintf(c.out, "%d pending record(s) %s\n", done, verb)
	return nil
}

func (c *cli) requeue(ctx context.Context, s *sqlstore.Store) error {
	ids, err := parseIDs(c.args, -1)
	if err != nil {
		return err
	}
	bar := newProgress(c.errOut, int64(len(ids)))
	for i, id := range ids {
		if err := s.Operator().RequeueLater(ctx, id); err != nil {
			bar.finish()
			err = notFound(ctx, s, id, err)
			if i > 0 {
				return fmt.Errorf("%w (requeued before it: %v)", err, ids[:i])
			}
			return err
		}
		bar.set(int64(i + 1))
	}
	bar.finish()
	if c.json {
		return c.printJSON(map[string]any{"requeued": ids})
	}
	fmt.Fprintf(c.out, "%d abandoned record(s) pending again, due for the service's stale resubmitter\n", len(ids))
	return nil
}

func (c *cli) clean(ctx context.Context, s *sqlstore.Store) error {
	total := 0
	bar := newProgress(c.errOut, 0)
	for {
		n, err := s.Clean(ctx, c.olderThan, c.batch)
		total += n
		if err != nil {
			bar.finish()
			return err
		}
		bar.set(int64(total))
		if n < c.batch {
			break
		}
	}
	bar.finish()
	if c.json {
		return c.printJSON(map[string]any{"deleted": total})
	}
	fmt.Fprintf(c.out, "%d completed record(s) deleted\n", total)
	return nil
}

// notFound turns the error of an operation on a record that is not in
// the table into the "record not found" that show gives, rather than the
// operation's own complaint (such as "not abandoned").
func notFound(ctx context.Context, s *sqlstore.Store, id int64, err error) error {
	if !errors.Is(err, recordstore.ErrNotAbandoned) {
		return err
	}
	if _, gerr := s.Operator().Get(ctx, id); errors.Is(gerr, sqlstore.ErrRecordNotFound) {
		return gerr
	}
	return err
}

func (c *cli) retire(ctx context.Context, s *sqlstore.Store) error {
	n, err := s.Retire(ctx, c.topic, c.consumer)
	if err != nil {
		if n > 0 {
			return fmt.Errorf("%w (completed before it: %d)", err, n)
		}
		return err
	}
	if c.json {
		return c.printJSON(map[string]any{"topic": c.topic, "consumer": c.consumer, "completed": n})
	}
	fmt.Fprintf(c.out, "%d pending deliveries of consumer %q to topic %q completed\n", n, c.consumer, c.topic)
	return nil
}
