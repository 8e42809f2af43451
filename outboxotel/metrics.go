package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/outboxops"
)

// MetricsConfig configures [NewMetrics].
type MetricsConfig struct {
	// MeterProvider provides the meter of the instruments. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Namespace is the instrument names' first part. Defaults to "" (none),
	// as in the outboxmetrics package.
	Namespace string
	// Subsystem is the instrument names' second part. Defaults to "outbox".
	Subsystem string
	// ReadTimeout bounds the reading of the backlog at each collection.
	// Defaults to 5 seconds.
	ReadTimeout time.Duration
}

func (c *MetricsConfig) setDefaults() {
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Subsystem == "" {
		c.Subsystem = "outbox"
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 5 * time.Second
	}
}

// Validate reports a configuration error, if any.
func (c MetricsConfig) Validate() error {
	if c.MeterProvider == nil {
		return fmt.Errorf("%w: MeterProvider is nil", outbox.ErrInvalidConfig)
	}
	if c.ReadTimeout < 0 {
		return fmt.Errorf("%w: ReadTimeout %v is negative", outbox.ErrInvalidConfig, c.ReadTimeout)
	}
	for _, part := range []string{c.Namespace, c.Subsystem} {
		if strings.ContainsAny(part, " ./") {
			return fmt.Errorf("%w: instrument name part %q has a space, a dot or a slash", outbox.ErrInvalidConfig, part)
		}
	}
	return nil
}

// Attribute keys of the metrics, the labels of the outboxmetrics package.
const (
	// AttrTopic is the tracked topic of a measurement.
	AttrTopic = attribute.Key("topic")
	// AttrMetricConsumer is the consumer (the handler name) of a delivery
	// measurement; "" outside a router.
	AttrMetricConsumer = attribute.Key("consumer")
	// AttrResendKind is the kind of a resend measurement: replay,
	// resubmit or requeue ([observe.ResendKind]).
	AttrResendKind = attribute.Key("kind")
)

// Metrics is an [observe.Observer] that counts the outbox's flow with
// OpenTelemetry counters and reads the backlog into gauges at each
// collection; see the package documentation for the instruments. Give it to
// the registry with [outbox.Registry.SetObserver]. Safe for concurrent use.
type Metrics struct {
	reg    *outbox.Registry
	cfg    MetricsConfig
	logger watermill.LoggerAdapter

	published, completed, duplicates, failures, abandoned, resent, notOwned, unknown, mismatched metric.Int64Counter

	pending, consumerPending, readErrors metric.Int64ObservableGauge
	oldest, consumerOldest               metric.Float64ObservableGauge
	// unchecked and consumerUnchecked are the pending records that wait
	// for a receiver never seen (outboxops.TopicStatus.Unchecked).
	unchecked, consumerUnchecked metric.Int64ObservableGauge
	registration                 metric.Registration

	// opts caches the attribute option of each topic and consumer, so that
	// a count builds no attribute set.
	opts sync.Map // string -> metric.MeasurementOption
}

var _ observe.Observer = (*Metrics)(nil)

// NewMetrics creates the instruments of the registry's flow and backlog. It
// does not attach itself: call reg.SetObserver(m). [Metrics.Close] stops
// the backlog reads.
func NewMetrics(reg *outbox.Registry, cfg MetricsConfig, logger watermill.LoggerAdapter) (*Metrics, error) {
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
	m := &Metrics{reg: reg, cfg: cfg, logger: logger}
	meter := cfg.MeterProvider.Meter(ScopeName)
	var errs []error
	counter := func(name, unit, help string) metric.Int64Counter {
		c, err := meter.Int64Counter(m.name(name), metric.WithUnit(unit), metric.WithDescription(help))
		errs = append(errs, err)
		return c
	}
	m.published = counter("records_published", "{record}", "Tracked messages saved and sent by the publisher.")
	m.completed = counter("records_completed", "{delivery}", "Deliveries completed after their handler succeeded or dropped the message.")
	m.duplicates = counter("duplicates_skipped", "{delivery}", "Deliveries acknowledged without handling because the consumer had already completed the record.")
	m.failures = counter("handler_failures", "{delivery}", "Handler failures of tracked messages.")
	m.abandoned = counter("records_abandoned", "{delivery}", "Deliveries abandoned after their last allowed attempt.")
	m.resent = counter("records_resent", "{record}", "Records sent again, by kind: replay (startup), resubmit (stale resubmitter) or requeue.")
	m.notOwned = counter("not_owned", "{message}", "Messages with outbox metadata this service does not own (another service's or topic's record, or an undeclared consumer); handled untracked.")
	m.unknown = counter("unknown_records", "{message}", "Messages naming a record of this service's table that does not exist; acknowledged without handling.")
	m.mismatched = counter("mismatched_messages", "{message}", "Messages naming a record of this service's table that was saved for another message (another UUID); acknowledged without handling.")

	intGauge := func(name, unit, help string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(m.name(name), metric.WithUnit(unit), metric.WithDescription(help))
		errs = append(errs, err)
		return g
	}
	floatGauge := func(name, help string) metric.Float64ObservableGauge {
		g, err := meter.Float64ObservableGauge(m.name(name), metric.WithUnit("s"), metric.WithDescription(help))
		errs = append(errs, err)
		return g
	}
	m.pending = intGauge("pending_records", "{record}", "Records waiting to be completed.")
	m.oldest = floatGauge("oldest_pending_age", "Age of the oldest pending record by the database clock; 0 when none is pending.")
	m.consumerPending = intGauge("consumer_pending_records", "{record}", "Records a declared consumer has still to complete.")
	m.consumerOldest = floatGauge("consumer_oldest_pending_age", "Age of the oldest record a declared consumer has still to complete; 0 when none.")
	m.unchecked = intGauge("unchecked_records", "{record}", "Pending records that wait for a receiver never seen checking the topic's records: a remote consumer that never confirmed, a declared consumer never deployed.")
	m.consumerUnchecked = intGauge("consumer_unchecked_records", "{record}", "Records a declared consumer has still to complete while it was never seen checking one; 0 once it was.")
	// No unit: an exporter to Prometheus would turn "1" into a "_ratio" suffix.
	m.readErrors = intGauge("status_read_errors", "", "1 when the last collection could not read the backlog.")
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("outboxotel: creating the instruments: %w", err)
	}
	r, err := meter.RegisterCallback(m.observeBacklog, m.pending, m.oldest, m.consumerPending, m.consumerOldest, m.unchecked, m.consumerUnchecked, m.readErrors)
	if err != nil {
		return nil, fmt.Errorf("outboxotel: registering the backlog callback: %w", err)
	}
	m.registration = r
	return m, nil
}

// name joins the configured name parts with dots; an exporter to
// Prometheus turns them into the outboxmetrics package's names (dots to
// underscores, "_total" on counters, "_seconds" from the unit).
func (m *Metrics) name(base string) string {
	parts := make([]string, 0, 3)
	for _, p := range []string{m.cfg.Namespace, m.cfg.Subsystem, base} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ".")
}

// Close stops reading the backlog at collections; the counters stay.
func (m *Metrics) Close() error { return m.registration.Unregister() }

// observeBacklog reads the pending records of every store once per
// collection.
func (m *Metrics) observeBacklog(ctx context.Context, o metric.Observer) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.ReadTimeout)
	defer cancel()
	sts, err := outboxops.ReadStatus(ctx, m.reg, outboxops.StatusOptions{})
	if err != nil {
		m.logger.Error("Reading the outbox backlog for metrics failed", err, nil)
		o.ObserveInt64(m.readErrors, 1)
		return nil
	}
	o.ObserveInt64(m.readErrors, 0)
	for _, st := range sts {
		topic := m.opt(st.Topic, "", false)
		o.ObserveInt64(m.pending, int64(st.Pending), topic)
		o.ObserveFloat64(m.oldest, st.OldestPending.Seconds(), topic)
		o.ObserveInt64(m.unchecked, st.Unchecked, topic)
		for _, cs := range st.Consumers {
			consumer := m.opt(st.Topic, cs.Consumer, true)
			o.ObserveInt64(m.consumerPending, int64(cs.Pending), consumer)
			o.ObserveFloat64(m.consumerOldest, cs.OldestPending.Seconds(), consumer)
			o.ObserveInt64(m.consumerUnchecked, cs.Unchecked, consumer)
		}
	}
	return nil
}

// opt returns the attribute option of a topic, with a consumer when
// perConsumer.
func (m *Metrics) opt(topic, consumer string, perConsumer bool) metric.MeasurementOption {
	key := topic
	if perConsumer {
		key = topic + "\x00" + consumer
	}
	if o, ok := m.opts.Load(key); ok {
		return o.(metric.MeasurementOption)
	}
	kvs := []attribute.KeyValue{AttrTopic.String(topic)}
	if perConsumer {
		kvs = append(kvs, AttrMetricConsumer.String(consumer))
	}
	o, _ := m.opts.LoadOrStore(key, metric.WithAttributeSet(attribute.NewSet(kvs...)))
	return o.(metric.MeasurementOption)
}

// The Observer methods have no context; the counts carry none.

// Published implements [observe.Observer].
func (m *Metrics) Published(name string, n int) {
	m.published.Add(context.Background(), int64(n), m.opt(name, "", false))
}

// Handled implements [observe.Observer].
func (m *Metrics) Completed(name, consumer string) {
	m.completed.Add(context.Background(), 1, m.opt(name, consumer, true))
}

// DuplicateSkipped implements [observe.Observer].
func (m *Metrics) DuplicateSkipped(name, consumer string) {
	m.duplicates.Add(context.Background(), 1, m.opt(name, consumer, true))
}

// Failed implements [observe.Observer].
func (m *Metrics) Failed(name, consumer string) {
	m.failures.Add(context.Background(), 1, m.opt(name, consumer, true))
}

// Abandoned implements [observe.Observer].
func (m *Metrics) Abandoned(name, consumer string) {
	m.abandoned.Add(context.Background(), 1, m.opt(name, consumer, true))
}

// Resent implements [observe.Observer].
func (m *Metrics) Resent(topic string, kind observe.ResendKind, n int) {
	m.resent.Add(context.Background(), int64(n), metric.WithAttributes(AttrTopic.String(topic), AttrResendKind.String(string(kind))))
}

// NotOwned implements [observe.Observer].
func (m *Metrics) NotOwned(topic, consumer string) {
	m.notOwned.Add(context.Background(), 1, m.opt(topic, consumer, true))
}

// UnknownRecord implements [observe.Observer].
func (m *Metrics) UnknownRecord(name, consumer string) {
	m.unknown.Add(context.Background(), 1, m.opt(name, consumer, true))
}

// Mismatched implements [observe.Observer].
func (m *Metrics) Mismatched(topic, consumer string) {
	m.mismatched.Add(context.Background(), 1, m.opt(topic, consumer, true))
}
