package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
)

// StaleResubmitterConfig configures [NewStaleResubmitter].
type StaleResubmitterConfig struct {
	// OlderThan is how long a record may stay pending after its last send,
	// by the database clock, before it is sent again. Defaults to 5
	// minutes.
	OlderThan time.Duration
	// Interval is the time between two scans. Defaults to 1 minute.
	Interval time.Duration
	// BatchSize is how many records one claim takes and one Publish sends.
	// Defaults to 100.
	BatchSize int
	// MaxBatchBytes bounds a claim by the bytes of its payloads and
	// metadata, as [ReplayConfig.MaxPageBytes] bounds a page of replay: a
	// claim ends with the record that reaches it. Defaults to
	// [DefaultMaxPageBytes] (16 MiB).
	MaxBatchBytes int
	// StatementTimeout bounds each database statement of a round (the
	// table identity read, each claim), so that a database that never
	// answers fails the round (logged by Run; the next round tries again)
	// instead of hanging it. Defaults to [DefaultStatementTimeout] (30
	// seconds).
	StatementTimeout time.Duration
}

// The defaults of OlderThan and Interval; variables so that the tests of
// the README's adoption can shorten them.
var (
	defaultResubmitOlderThan = 5 * time.Minute
	defaultResubmitInterval  = time.Minute
)

func (c *StaleResubmitterConfig) setDefaults() {
	if c.OlderThan == 0 {
		c.OlderThan = defaultResubmitOlderThan
	}
	if c.Interval == 0 {
		c.Interval = defaultResubmitInterval
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxPageBytes
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
}

// Validate reports a configuration error, if any.
func (c StaleResubmitterConfig) Validate() error {
	if c.OlderThan < 0 || c.Interval < 0 || c.BatchSize < 1 || c.StatementTimeout < 0 {
		return fmt.Errorf("%w: stale resubmit needs a positive OlderThan, Interval, BatchSize and StatementTimeout (got %v, %v, %d, %v)", ErrInvalidConfig, c.OlderThan, c.Interval, c.BatchSize, c.StatementTimeout)
	}
	if c.MaxBatchBytes < 1 {
		return fmt.Errorf("%w: stale resubmit needs a positive MaxBatchBytes (got %d)", ErrInvalidConfig, c.MaxBatchBytes)
	}
	return nil
}

// StaleResubmitter sends again, while the service runs, the pending records
// whose last send is older than [StaleResubmitterConfig.OlderThan], so that a
// record whose message was lost does not wait for the next start. It uses
// the stores that implement [recordstore.StaleClaimer]; others are skipped. The claim
// stamps the send time, so every instance of a service may run one: each
// record is claimed by one of them per period.
type StaleResubmitter struct {
	reg    *Registry
	out    *resender
	cfg    StaleResubmitterConfig
	logger watermill.LoggerAdapter
}

// NewStaleResubmitter returns a resubmitter that sends through pub, decorated
// or not: records are never saved again.
func NewStaleResubmitter(reg *Registry, pub message.Publisher, cfg StaleResubmitterConfig, logger watermill.LoggerAdapter) (*StaleResubmitter, error) {
	out, err := newResender(reg, pub, ResendResubmit)
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &StaleResubmitter{reg: reg, out: out, cfg: cfg, logger: logger}, nil
}

// ResubmitOnce claims and sends the stale records of every tracked topic once
// and returns how many it sent per name. It stops at the first error; the
// records of a batch whose send failed were stamped as sent and are tried
// again after OlderThan.
func (r *StaleResubmitter) ResubmitOnce(ctx context.Context) (ResendResult, error) {
	result := ResendResult{}
	if !r.reg.enabled {
		return result, nil
	}
	for _, t := range r.reg.entries() {
		name := t.topic
		claimer, ok := t.store.(recordstore.StaleClaimer)
		if !ok {
			continue
		}
		id, err := identityWithin(ctx, r.cfg.StatementTimeout, t)
		if err != nil {
			return result, err
		}
		// The round walks the backlog by id once: with an OlderThan
		// shorter than the round, its first claims would be stale again
		// before its last, and a round without a cursor would go on for
		// ever on records that are not being completed.
		var after int64
		reads := newPageReads(r.cfg.BatchSize, r.cfg.MaxBatchBytes)
		for {
			sctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
			recs, more, err := reads.stale(sctx, claimer, name, after, r.cfg.OlderThan)
			cancel()
			if err != nil {
				return result, &ResendError{Topic: name, Err: fmt.Errorf("claiming stale records: %w", err)}
			}
			if len(recs) == 0 {
				break
			}
			claimed := len(recs)
			after = recs[claimed-1].ID
			if recs = dueNow(recs, time.Now()); len(recs) > 0 {
				if err := r.out.send(ctx, t, id, recs); err != nil {
					return result, err
				}
				result[name] += len(recs)
			}
			if !more {
				break
			}
		}
		if n := result[name]; n > 0 {
			r.logger.Info("Resubmitted stale pending records", watermill.LogFields{"topic": name, "resubmitted": n})
		}
	}
	return result, nil
}

// Run resubmits every Interval until ctx is done, then returns nil. A failed
// round is logged and the next round tries again. While it runs, the
// middleware sends the records of topics with an order key
// ([Tracked.OrderKey]) again through its publisher, when a record of the
// key completes or a held record asks for the one that holds it.
func (r *StaleResubmitter) Run(ctx context.Context) error {
	defer r.reg.running(r.out)()
	r.logger.Debug("Stale resubmitter running", watermill.LogFields{"interval": r.cfg.Interval, "older_than": r.cfg.OlderThan})
	return runEvery(ctx, r.cfg.Interval, r.logger, "Stale resubmit round failed; the next round tries again", func(ctx context.Context) error {
		_, err := r.ResubmitOnce(ctx)
		return err
	})
}

// Plugin returns a router plugin that runs the resubmitter while the router
// runs: it starts once the router is running (after the startup replay) and
// stops when the router starts closing. The router needs at least one
// handler; without one, call Run.
func (r *StaleResubmitter) Plugin() message.RouterPlugin {
	return runWithRouter(r.reg, r.Run)
}

// dueNow keeps the records whose message is not delayed past now by
// Watermill's delay metadata (components/delay): a delayed message that is
// still waiting for its time is not lost, and resending it early would
// deliver it before it is due. The claim stamped it as sent, so it is
// looked at again after OlderThan.
func dueNow(recs []recordstore.Record, now time.Time) []recordstore.Record {
	due := recs[:0]
	for _, rec := range recs {
		if until, err := time.Parse(time.RFC3339, rec.Metadata[delay.DelayedUntilKey]); err == nil && until.After(now) {
			continue
		}
		due = append(due, rec)
	}
	return due
}
