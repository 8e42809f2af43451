package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

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
	// StatementTimeout bounds each DELETE, so that a database that never
	// answers fails the cleanup (logged by Run; the next one tries again)
	// instead of hanging it. Defaults to [DefaultStatementTimeout] (30
	// seconds).
	StatementTimeout time.Duration
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
		c.StatementTimeout = DefaultStatementTimeout
	}
}

// Validate reports a configuration error, if any.
func (c CleanerConfig) Validate() error {
	if c.OlderThan < 0 || c.Interval < 0 || c.BatchSize < 1 {
		return fmt.Errorf("%w: cleanup needs a non-negative OlderThan and a positive Interval and BatchSize (got %v, %v, %d)", ErrInvalidConfig, c.OlderThan, c.Interval, c.BatchSize)
	}
	if c.StatementTimeout < 0 {
		return fmt.Errorf("%w: cleanup StatementTimeout %v is negative", ErrInvalidConfig, c.StatementTimeout)
	}
	return nil
}

// Cleaner deletes completed records older than [CleanerConfig.OlderThan]
// from every store of the registry that implements [recordstore.Cleaner], in bounded
// batches. Abandoned and pending records are kept. Several instances may run
// one: each batch is a single short DELETE.
type Cleaner struct {
	stores []recordstore.Store
	cfg    CleanerConfig
	logger watermill.LoggerAdapter
}

// NewCleaner returns a cleaner of the registry's stores.
func NewCleaner(reg *Registry, cfg CleanerConfig, logger watermill.LoggerAdapter) (*Cleaner, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	c := &Cleaner{cfg: cfg, logger: logger}
	for _, t := range reg.stores() {
		if _, ok := t.store.(recordstore.Cleaner); ok {
			c.stores = append(c.stores, t.store)
		}
	}
	return c, nil
}

// CleanOnce purges every store until a batch comes back short, and returns
// how many records it deleted.
func (c *Cleaner) CleanOnce(ctx context.Context) (int, error) {
	total := 0
	for _, s := range c.stores {
		for {
			sctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
			n, err := s.(recordstore.Cleaner).Clean(sctx, c.cfg.OlderThan, c.cfg.BatchSize)
			cancel()
			total += n
			if err != nil {
				return total, fmt.Errorf("outbox: cleanup: %w", err)
			}
			if n < c.cfg.BatchSize {
				break
			}
		}
	}
	if total > 0 {
		c.logger.Info("Deleted completed records", watermill.LogFields{"deleted": total})
	}
	return total, nil
}

// Run cleans every Interval until ctx is done, then returns nil. A failed
// cleanup is logged and the next one tries again.
func (c *Cleaner) Run(ctx context.Context) error {
	return runEvery(ctx, c.cfg.Interval, c.logger, "Cleanup failed; the next one tries again", func(ctx context.Context) error {
		_, err := c.CleanOnce(ctx)
		return err
	})
}

// Plugin returns a router plugin that runs the cleaner while the router runs
// and stops it when the router starts closing. The router needs at least one
// handler; without one, call Run.
func (c *Cleaner) Plugin() message.RouterPlugin { return runWithRouter(c.Run) }
