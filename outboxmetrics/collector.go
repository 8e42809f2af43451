package outboxmetrics

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/outboxops"
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

const (
	nameLabel     = "topic"
	consumerLabel = "consumer"
	kindLabel     = "kind"
)

// Collector is the outbox's Prometheus collector; see the package
// documentation.
type Collector struct {
	reg     *outbox.Registry
	cfg     Config
	logger  watermill.LoggerAdapter
	counts  map[string]*prometheus.CounterVec
	pending *prometheus.Desc
	oldest  *prometheus.Desc
	// consumerPending and consumerOldest break the backlog down per
	// declared consumer.
	consumerPending *prometheus.Desc
	consumerOldest  *prometheus.Desc
	// unchecked and consumerUnchecked are the pending records that wait
	// for a receiver never seen (outboxops.TopicStatus.Unchecked).
	unchecked         *prometheus.Desc
	consumerUnchecked *prometheus.Desc
	// heldKeys are the order keys an abandoned record holds
	// (outboxops.TopicStatus.HeldKeys).
	heldKeys *prometheus.Desc
	scrapeE  *prometheus.Desc
}

var (
	_ prometheus.Collector         = (*Collector)(nil)
	_ observe.Observer             = (*Collector)(nil)
	_ observe.ConfirmationObserver = (*Collector)(nil)
	_ observe.InboxObserver        = (*Collector)(nil)
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
	perName, perConsumer := []string{nameLabel}, []string{nameLabel, consumerLabel}
	for name, m := range map[string]struct {
		help   string
		labels []string
	}{
		"records_published_total":             {"Tracked messages saved and sent by the publisher.", perName},
		"records_completed_total":             {"Deliveries completed after their handler succeeded or dropped the message.", perConsumer},
		"duplicates_skipped_total":            {"Deliveries acknowledged without handling because the consumer had already completed the record.", perConsumer},
		"handler_failures_total":              {"Handler failures of tracked messages.", perConsumer},
		"records_abandoned_total":             {"Deliveries abandoned after their last allowed attempt.", perConsumer},
		"records_resent_total":                {"Records sent again, by kind: replay (startup), resubmit (stale resubmitter) or requeue.", []string{nameLabel, kindLabel}},
		"not_owned_total":                     {"Messages with outbox metadata this service does not own (another service's or topic's record, or an undeclared consumer); handled untracked.", perConsumer},
		"unknown_records_total":               {"Messages naming a record of this service's table that does not exist; acknowledged without handling.", perConsumer},
		"mismatched_messages_total":           {"Messages naming a record of this service's table that was saved for another message (another UUID); acknowledged without handling.", perConsumer},
		"confirmations_rejected_total":        {"Confirmations of remote consumers that completed nothing: malformed, of another table, of an undeclared consumer, or of another message.", perConsumer},
		"inbox_business_key_duplicates_total": {"Other services' messages acknowledged without handling because the consumer had handled another message with the same business key.", perConsumer},
	} {
		c.counts[name] = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.Namespace, Subsystem: cfg.Subsystem, Name: name, Help: m.help,
		}, m.labels)
	}
	fq := func(name string) string { return prometheus.BuildFQName(cfg.Namespace, cfg.Subsystem, name) }
	c.pending = prometheus.NewDesc(fq("pending_records"), "Records waiting to be completed.", []string{nameLabel}, nil)
	c.oldest = prometheus.NewDesc(fq("oldest_pending_age_seconds"), "Age of the oldest pending record by the database clock; 0 when none is pending.", []string{nameLabel}, nil)
	c.consumerPending = prometheus.NewDesc(fq("consumer_pending_records"), "Records a declared consumer has still to complete.", perConsumer, nil)
	c.consumerOldest = prometheus.NewDesc(fq("consumer_oldest_pending_age_seconds"), "Age of the oldest record a declared consumer has still to complete; 0 when none.", perConsumer, nil)
	c.unchecked = prometheus.NewDesc(fq("unchecked_records"), "Pending records that wait for a receiver never seen checking the topic's records: a remote consumer that never confirmed, a declared consumer never deployed.", []string{nameLabel}, nil)
	c.consumerUnchecked = prometheus.NewDesc(fq("consumer_unchecked_records"), "Records a declared consumer has still to complete while it was never seen checking one; 0 once it was.", perConsumer, nil)
	c.heldKeys = prometheus.NewDesc(fq("held_keys"), "Order keys (outbox.Tracked.OrderKey) whose later records are held until an abandoned record is requeued.", []string{nameLabel}, nil)
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
	ch <- c.consumerPending
	ch <- c.consumerOldest
	ch <- c.unchecked
	ch <- c.consumerUnchecked
	ch <- c.heldKeys
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
	sts, err := outboxops.ReadStatus(ctx, c.reg, outboxops.StatusOptions{})
	failed := 0.0
	if err != nil {
		c.logger.Error("Reading the outbox backlog for metrics failed", err, nil)
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(c.scrapeE, prometheus.GaugeValue, failed)
	for _, st := range sts {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(st.Pending), st.Topic)
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, st.OldestPending.Seconds(), st.Topic)
		ch <- prometheus.MustNewConstMetric(c.unchecked, prometheus.GaugeValue, float64(st.Unchecked), st.Topic)
		ch <- prometheus.MustNewConstMetric(c.heldKeys, prometheus.GaugeValue, float64(st.HeldKeys), st.Topic)
		for _, cs := range st.Consumers {
			ch <- prometheus.MustNewConstMetric(c.consumerPending, prometheus.GaugeValue, float64(cs.Pending), st.Topic, cs.Consumer)
			ch <- prometheus.MustNewConstMetric(c.consumerOldest, prometheus.GaugeValue, cs.OldestPending.Seconds(), st.Topic, cs.Consumer)
			ch <- prometheus.MustNewConstMetric(c.consumerUnchecked, prometheus.GaugeValue, float64(cs.Unchecked), st.Topic, cs.Consumer)
		}
	}
}

func (c *Collector) add(metric string, n int, labels ...string) {
	c.counts[metric].WithLabelValues(labels...).Add(float64(n))
}

// Published implements [observe.Observer].
func (c *Collector) Published(name string, n int) { c.add("records_published_total", n, name) }

// Handled implements [observe.Observer].
func (c *Collector) Completed(name, consumer string) {
	c.add("records_completed_total", 1, name, consumer)
}

// DuplicateSkipped implements [observe.Observer].
func (c *Collector) DuplicateSkipped(name, consumer string) {
	c.add("duplicates_skipped_total", 1, name, consumer)
}

// Failed implements [observe.Observer].
func (c *Collector) Failed(name, consumer string) { c.add("handler_failures_total", 1, name, consumer) }

// Abandoned implements [observe.Observer].
func (c *Collector) Abandoned(name, consumer string) {
	c.add("records_abandoned_total", 1, name, consumer)
}

// Resent implements [observe.Observer].
func (c *Collector) Resent(topic string, kind observe.ResendKind, n int) {
	c.add("records_resent_total", n, topic, string(kind))
}

// NotOwned implements [observe.Observer].
func (c *Collector) NotOwned(topic, consumer string) { c.add("not_owned_total", 1, topic, consumer) }

// UnknownRecord implements [observe.Observer].
func (c *Collector) UnknownRecord(name, consumer string) {
	c.add("unknown_records_total", 1, name, consumer)
}

// Mismatched implements [observe.Observer].
func (c *Collector) Mismatched(topic, consumer string) {
	c.add("mismatched_messages_total", 1, topic, consumer)
}

// ConfirmationRejected implements [observe.ConfirmationObserver].
func (c *Collector) ConfirmationRejected(topic, consumer string) {
	c.add("confirmations_rejected_total", 1, topic, consumer)
}

// BusinessKeyDuplicate implements [observe.InboxObserver].
func (c *Collector) BusinessKeyDuplicate(topic, consumer string) {
	c.add("inbox_business_key_duplicates_total", 1, topic, consumer)
}
