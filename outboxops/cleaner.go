package outboxops

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/hooks"
	"github.com/wmoutbox/outbox/internal/loop"
	"github.com/wmoutbox/outbox/recordstore"
)

// CleanerConfig configures [NewCleaner].
type CleanerConfig struct {
	// OlderThan is how long a completed record is kept after its
	// completion, by the database clock. Defaults to 7 days.
	OlderThan time.Duration
	// Interval is the time between two cleanups. Defaults to 1 hour.
	Interval time.Duration
	// BatchSize is how many records one DELETE removes at most, so that no
	// statement holds locks for long. Defaults to 1000.
	BatchSize int
	// Pause is how long a cleanup waits after each full batch before it
	// deletes the next, so that deleting a large backlog leaves the
	// database room for the deliveries it runs beside: each batch writes
	// its deletions to the database's log, which the next commit of a
	// publish must flush too. Defaults to as long as the batch took, so
	// that a cleanup keeps one connection busy at most half of the time; a
	// negative Pause waits not at all.
	Pause time.Duration
	// StatementTimeout bounds each DELETE, so that a database that never
	// answers fails the cleanup (logged by Run; the next one tries again)
	// instead of hanging it. Defaults to [outbox.DefaultStatementTimeout] (30
	// seconds).
	StatementTimeout time.Duration
	// Inboxes are inboxes of this service ([outbox.MiddlewareConfig.Inbox]) to
	// clean too: their entries older than InboxOlderThan are deleted in the
	// same rounds and batches. Defaults to none.
	Inboxes []recordstore.Inbox
	// InboxOlderThan is how long an inbox entry is kept, by the database
	// clock. A copy of a message that arrives after its entry was deleted
	// runs the handler again, so keep entries longer than the senders'
	// longest resend interval: their stale resubmitter's OlderThan, and the
	// longest a sender may stay down and then replay. Defaults to 7 days.
	InboxOlderThan time.Duration
}

func (c *CleanerConfig) setDefaults() {
	if c.OlderThan == 0 {
		c.OlderThan = 7 * 24 * time.Hour
	}
	if c.Interval == 0 {
		c.Interval = time.Hour
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = outbox.DefaultStatementTimeout
	}
	if c.InboxOlderThan == 0 {
		c.InboxOlderThan = 7 * 24 * time.Hour
	}
}

// Validate reports a configuration error, if any.
func (c CleanerConfig) Validate() error {
	if c.OlderThan < 0 || c.Interval < 0 || c.BatchSize < 1 {
		return fmt.Errorf("%w: cleanup needs a non-negative OlderThan and a positive Interval and BatchSize (got %v, %v, %d)", outbox.ErrInvalidConfig, c.OlderThan, c.Interval, c.BatchSize)
	}
	if c.StatementTimeout < 0 {
		return fmt.Errorf("%w: cleanup StatementTimeout %v is negative", outbox.ErrInvalidConfig, c.StatementTimeout)
	}
	if c.InboxOlderThan < 0 {
		return fmt.Errorf("%w: cleanup InboxOlderThan %v is negative", outbox.ErrInvalidConfig, c.InboxOlderThan)
	}
	for i, in := range c.Inboxes {
		if in == nil {
			return fmt.Errorf("%w: cleanup inbox #%d is nil", outbox.ErrInvalidConfig, i)
		}
	}
	return nil
}

// Cleaner deletes completed records older than [CleanerConfig.OlderThan]
// from every store of the registry that implements [recordstore.Cleaner], and
// the entries of [CleanerConfig.Inboxes] older than
// [CleanerConfig.InboxOlderThan], in bounded batches. Abandoned and pending
// records are kept. Several instances may run one: each batch is a single
// short DELETE.
type Cleaner struct {
	reg     *outbox.Registry
	targets []cleanTarget
	cfg     CleanerConfig
	logger  watermill.LoggerAdapter
}

// cleanTarget is one table the cleaner deletes from, and the age it keeps.
type cleanTarget struct {
	clean     func(ctx context.Context, olderThan time.Duration, limit int) (int, error)
	olderThan time.Duration
	what      string
}

// NewCleaner returns a cleaner of the registry's stores.
func NewCleaner(reg *outbox.Registry, cfg CleanerConfig, logger watermill.LoggerAdapter) (*Cleaner, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", outbox.ErrInvalidConfig)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	c := &Cleaner{reg: reg, cfg: cfg, logger: logger}
	for _, store := range stores(reg) {
		if cl, ok := store.(recordstore.Cleaner); ok {
			c.targets = append(c.targets, cleanTarget{clean: cl.Clean, olderThan: cfg.OlderThan, what: "completed records"})
		}
	}
	for _, in := range cfg.Inboxes {
		c.targets = append(c.targets, cleanTarget{clean: in.Clean, olderThan: cfg.InboxOlderThan, what: "inbox entries"})
	}
	return c, nil
}

// CleanOnce cleans every store and inbox until a batch comes back short,
// and returns how many records and entries it deleted.
func (c *Cleaner) CleanOnce(ctx context.Context) (int, error) {
	total := 0
	for _, t := range c.targets {
		deleted := 0
		for {
			start := time.Now()
			sctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
			n, err := t.clean(sctx, t.olderThan, c.cfg.BatchSize)
			cancel()
			deleted += n
			if err != nil {
				return total + deleted, fmt.Errorf("outbox: cleanup of %s: %w", t.what, err)
			}
			if n < c.cfg.BatchSize {
				break
			}
			if err := c.pause(ctx, time.Since(start)); err != nil {
				return total + deleted, err
			}
		}
		if deleted > 0 {
			c.logger.Info("Deleted old "+t.what, watermill.LogFields{"deleted": deleted})
		}
		total += deleted
	}
	return total, nil
}

// pause waits between two batches, as [CleanerConfig.Pause] says, for a
// batch that took took; it returns ctx's error if ctx ends first.
func (c *Cleaner) pause(ctx context.Context, took time.Duration) error {
	d := c.cfg.Pause
	switch {
	case d < 0:
		return nil
	case d == 0:
		d = took
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run cleans every Interval until ctx is done, then returns nil. A failed
// cleanup is logged and the next one tries again.
func (c *Cleaner) Run(ctx context.Context) error {
	return loop.Every(ctx, c.cfg.Interval, c.logger, "Cleanup failed; the next one tries again", func(ctx context.Context) error {
		_, err := c.CleanOnce(ctx)
		return err
	})
}

// Plugin returns a router plugin that runs the cleaner while the router runs
// and stops it when the router starts closing. The router needs at least one
// handler; without one, call Run.
func (c *Cleaner) Plugin() message.RouterPlugin { return hooks.RunWithRouter(c.reg, c.Run) }
