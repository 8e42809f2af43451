package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/internal/loop"
	"github.com/wmoutbox/outbox/internal/pages"
	"github.com/wmoutbox/outbox/observe"
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
	// ConfirmWithin is how long a record of a topic with remote consumers
	// waits after a send for their confirmations before it is sent again,
	// doubling with each resend up to OlderThan; such topics are scanned
	// every ConfirmWithin/3. Defaults to 30 seconds, or OlderThan when
	// shorter.
	ConfirmWithin time.Duration
	// BatchSize is how many records one claim takes and one Publish sends.
	// Defaults to 100.
	BatchSize int
	// MaxBatchBytes ends a claim with the record whose payload and
	// metadata reach it. Defaults to [DefaultMaxPageBytes] (16 MiB).
	MaxBatchBytes int
	// StatementTimeout bounds each database statement of a round; one that
	// runs out fails the round, which is logged. Defaults to
	// [DefaultStatementTimeout] (30 seconds).
	StatementTimeout time.Duration
}

// The defaults of OlderThan and Interval; variables so that the tests of
// the README's adoption can shorten them.
var (
	defaultResubmitOlderThan = 5 * time.Minute
	defaultResubmitInterval  = time.Minute
	defaultConfirmWithin     = 30 * time.Second
)

func (c *StaleResubmitterConfig) setDefaults() {
	if c.OlderThan == 0 {
		c.OlderThan = defaultResubmitOlderThan
	}
	if c.Interval == 0 {
		c.Interval = defaultResubmitInterval
	}
	if c.ConfirmWithin == 0 {
		c.ConfirmWithin = min(defaultConfirmWithin, c.OlderThan)
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
	if c.ConfirmWithin <= 0 || c.ConfirmWithin > c.OlderThan {
		return fmt.Errorf("%w: stale resubmit needs a positive ConfirmWithin no longer than OlderThan (got %v, %v)", ErrInvalidConfig, c.ConfirmWithin, c.OlderThan)
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
	// warned is when each topic's unconfirmed resends were last logged.
	warnMu sync.Mutex
	warned map[string]time.Time
}

// NewStaleResubmitter returns a resubmitter that sends through pub, decorated
// or not: records are never saved again.
func NewStaleResubmitter(reg *Registry, pub message.Publisher, cfg StaleResubmitterConfig, logger watermill.LoggerAdapter) (*StaleResubmitter, error) {
	out, err := newResender(reg, pub, observe.ResendResubmit)
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
	return &StaleResubmitter{reg: reg, out: out, cfg: cfg, logger: logger, warned: map[string]time.Time{}}, nil
}

// ResubmitOnce claims and sends the stale records of every tracked topic once
// and returns how many it sent per name. It stops at the first error; the
// records of a batch whose send failed were stamped as sent and are tried
// again after OlderThan (ConfirmWithin for a topic with remote consumers).
func (r *StaleResubmitter) ResubmitOnce(ctx context.Context) (ResendResult, error) {
	return r.resubmit(ctx, false)
}

// resubmit runs a round over every tracked topic, or over those with
// remote consumers only.
func (r *StaleResubmitter) resubmit(ctx context.Context, remoteOnly bool) (ResendResult, error) {
	result := ResendResult{}
	if !r.reg.enabled {
		return result, nil
	}
	for _, t := range r.reg.entries() {
		if remoteOnly && len(t.remote) == 0 {
			continue
		}
		claimer, ok := t.store.(recordstore.StaleClaimer)
		if !ok {
			continue
		}
		n, err := r.resubmitTopic(ctx, t, claimer)
		if n > 0 {
			result[t.topic] = n
		}
		if err != nil {
			return result, err
		}
		if n > 0 {
			r.logger.Info("Resubmitted stale pending records", watermill.LogFields{"topic": t.topic, "resubmitted": n})
			r.unconfirmed(t, n)
		}
	}
	return result, nil
}

// resubmitTopic claims and sends the stale records of one topic.
func (r *StaleResubmitter) resubmitTopic(ctx context.Context, t *tracked, claimer recordstore.StaleClaimer) (int, error) {
	id, err := identityWithin(ctx, r.cfg.StatementTimeout, t)
	if err != nil {
		return 0, err
	}
	spaced, _ := claimer.(recordstore.SpacedClaimer)
	if len(t.remote) == 0 {
		spaced = nil
	}
	// The round walks the backlog by id once: with an OlderThan shorter
	// than the round, its first claims would be stale again before its
	// last, and a round without a cursor would go on for ever on records
	// that are not being completed.
	reads := pages.New(r.cfg.BatchSize, r.cfg.MaxBatchBytes)
	claim := func(ctx context.Context, after int64) ([]recordstore.Record, bool, error) {
		if spaced != nil {
			return reads.Spaced(ctx, spaced, t.topic, after, r.cfg.ConfirmWithin, r.cfg.OlderThan)
		}
		return reads.Stale(ctx, claimer, t.topic, after, r.cfg.OlderThan)
	}
	due := func(recs []recordstore.Record) []recordstore.Record { return dueNow(recs, time.Now()) }
	return r.out.sendClaimed(ctx, t, id, r.cfg.StatementTimeout, "stale records", claim, due)
}

// unconfirmed warns, at most once per ConfirmWithin and topic, that records
// of a topic with remote consumers were sent again because confirmations
// did not come, naming each remote consumer and when it last confirmed:
// one that stopped confirming stands out.
func (r *StaleResubmitter) unconfirmed(t *tracked, resent int) {
	if len(t.remote) == 0 {
		return
	}
	now := time.Now()
	r.warnMu.Lock()
	last, ok := r.warned[t.topic]
	if ok && now.Sub(last) < r.cfg.ConfirmWithin {
		r.warnMu.Unlock()
		return
	}
	r.warned[t.topic] = now
	r.warnMu.Unlock()
	for _, consumer := range t.remote {
		fields := watermill.LogFields{"topic": t.topic, "consumer": consumer, "resent": resent, "confirm_within": r.cfg.ConfirmWithin}
		if ago, seen := t.lastConfirmed(consumer, now); seen {
			fields["last_confirmed_ago"] = ago.Round(time.Second).String()
		} else {
			fields["last_confirmed_ago"] = "never since this process started"
		}
		warn(r.logger, "Records of a topic with remote consumers were sent again: their confirmations did not come in time. A remote consumer that has stopped confirming leaves its deliveries pending", fields)
	}
}

// Run resubmits every Interval until ctx is done, then returns nil; a
// failed round is logged. While it runs, the middleware sends the next
// records of order keys again through its publisher.
func (r *StaleResubmitter) Run(ctx context.Context) error {
	defer r.reg.running(r.out)()
	r.logger.Debug("Stale resubmitter running", watermill.LogFields{"interval": r.cfg.Interval, "older_than": r.cfg.OlderThan})
	tick := r.cfg.Interval
	if r.reg.hasRemote() {
		tick = min(tick, max(r.cfg.ConfirmWithin/3, time.Millisecond))
	}
	lastFull := time.Now()
	return loop.Every(ctx, tick, r.logger, "Stale resubmit round failed; the next round tries again", func(ctx context.Context) error {
		full := time.Since(lastFull) >= r.cfg.Interval-tick/2
		if full {
			lastFull = time.Now()
		}
		_, err := r.resubmit(ctx, !full)
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
