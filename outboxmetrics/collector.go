package outboxmetrics

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/wmoutbox/outbox"
)

// Config configures [NewCollector].
type Config struct {
	// Namespace is the metric names' first part. Defaults to "" (none), as
	// in Watermill's metrics builder.
	Namespace string
	// Subsystem is the metric names' second part. Defaults to "outbox".
	Subsystem string
	// ScrapeTimeout bounds the reading of the backlog at each scrape.
	// Defaults to 5 seconds.
	ScrapeTimeout time.Duration
}

func (c *Config) setDefaults() {
	if c.Subsystem == "" {
		c.Subsystem = "outbox"
	}
	if c.ScrapeTimeout == 0 {
		c.ScrapeTimeout = 5 * time.Second
	}
}

// Validate reports a configuration error, if any.
func (c Config) Validate() error {
	if c.ScrapeTimeout < 0 {
		return fmt.Errorf("%w: ScrapeTimeout %v is negative", outbox.ErrInvalidConfig, c.ScrapeTimeout)
	}
	return nil
}

const nameLabel = "outbox_name"

// Collector is the outbox's Prometheus collector; see the package
// documentation.
type Collector struct {
	reg     *outbox.Registry
	cfg     Config
	logger  watermill.LoggerAdapter
	counts  map[string]*prometheus.CounterVec
	pending *prometheus.Desc
	oldest  *prometheus.Desc
	scrapeE *prometheus.Desc
}

var (
	_ prometheus.Collector = (*Collector)(nil)
	_ outbox.Observer      = (*Collector)(nil)
)

// NewCollector returns a collector of the registry's names. It does not
// attach itself: call reg.SetObserver(c) and prometheusRegistry.Register(c).
func NewCollector(reg *outbox.Registry, cfg Config, logger watermill.LoggerAdapter) (*Collector, error) {
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
	c := &Collector{reg: reg, cfg: cfg, logger: logger, counts: map[string]*prometheus.CounterVec{}}
	for name, help := range map[string]string{
		"records_published_total":  "Tracked messages saved and sent by the publisher.",
		"records_handled_total":    "Records completed after their handler succeeded or dropped the message.",
		"duplicates_skipped_total": "Deliveries acknowledged without handling because their record was no longer pending.",
		"handler_failures_total":   "Handler failures of tracked messages.",
		"records_abandoned_total":  "Records abandoned after their last allowed attempt.",
		"records_replayed_total":   "Records sent again by startup replay, the stale resubmitter or a resubmit.",
		"messages_not_owned_total": "Messages with outbox metadata this service does not own, handled untracked.",
		"unknown_records_total":    "Messages naming a record of this service's table that does not exist, acknowledged without handling.",
	} {
		c.counts[name] = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.Namespace, Subsystem: cfg.Subsystem, Name: name, Help: help,
		}, []string{nameLabel})
	}
	fq := func(name string) string { return prometheus.BuildFQName(cfg.Namespace, cfg.Subsystem, name) }
	c.pending = prometheus.NewDesc(fq("pending_records"), "Records waiting to be completed.", []string{nameLabel}, nil)
	c.oldest = prometheus.NewDesc(fq("oldest_pending_age_seconds"), "Age of the oldest pending record by the database clock; 0 when none is pending.", []string{nameLabel}, nil)
	c.scrapeE = prometheus.NewDesc(fq("status_read_errors"), "1 when the last scrape could not read the backlog.", nil, nil)
	return c, nil
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.counts {
		v.Describe(ch)
	}
	ch <- c.pending
	ch <- c.oldest
	ch <- c.scrapeE
}

// Collect implements prometheus.Collector: the counters, and the backlog
// read from the pending records of each store.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.counts {
		v.Collect(ch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ScrapeTimeout)
	defer cancel()
	sts, err := outbox.ReadStatus(ctx, c.reg, false)
	failed := 0.0
	if err != nil {
		c.logger.Error("Reading the outbox backlog for metrics failed", err, nil)
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(c.scrapeE, prometheus.GaugeValue, failed)
	for _, st := range sts {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(st.Pending), st.Name)
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, st.OldestPending.Seconds(), st.Name)
	}
}

func (c *Collector) add(metric, name string, n int) {
	c.counts[metric].WithLabelValues(name).Add(float64(n))
}

// Published implements [outbox.Observer].
func (c *Collector) Published(name string, n int) { c.add("records_published_total", name, n) }

// Handled implements [outbox.Observer].
func (c *Collector) Handled(name, _ string) { c.add("records_handled_total", name, 1) }

// DuplicateSkipped implements [outbox.Observer].
func (c *Collector) DuplicateSkipped(name, _ string) { c.add("duplicates_skipped_total", name, 1) }

// Failed implements [outbox.Observer].
func (c *Collector) Failed(name, _ string) { c.add("handler_failures_total", name, 1) }

// Abandoned implements [outbox.Observer].
func (c *Collector) Abandoned(name, _ string) { c.add("records_abandoned_total", name, 1) }

// NotOwned implements [outbox.Observer].
func (c *Collector) NotOwned(topic, _ string) { c.add("messages_not_owned_total", topic, 1) }

// UnknownRecord implements [outbox.Observer].
func (c *Collector) UnknownRecord(name, _ string) { c.add("unknown_records_total", name, 1) }

// Replayed implements [outbox.Observer].
func (c *Collector) Replayed(name string, n int) { c.add("records_replayed_total", name, n) }
