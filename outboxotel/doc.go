// Package outboxotel follows the outbox with OpenTelemetry: a span for each
// step of a tracked message, the trace context saved with its record so that
// the trace survives a restart, and the flow counters and backlog gauges as
// OTel metrics. It is a module of its own, so that the outbox module does
// not depend on OpenTelemetry.
//
//	tracer, err := outboxotel.NewTracer(outboxotel.TracerConfig{}) // the global TracerProvider and propagator
//	reg.SetTracer(tracer)
//	metrics, err := outboxotel.NewMetrics(reg, outboxotel.MetricsConfig{}, logger) // the global MeterProvider
//	reg.SetObserver(metrics) // beside outboxmetrics' collector: reg.SetObserver(observe.Observers(collector, metrics))
//
// Nothing else changes: the publisher, the middleware and the senders the
// service already has report to the registry's tracer and observer. Messages
// that are not tracked are not touched, and cost nothing more.
//
// # Spans
//
//	outbox publish <topic>   producer   a tracked publish: the save and the send (a TxPublisher's: the save in the transaction); outbox.id, outbox.tx
//	outbox resend <topic>    producer   a saved record sent again; outbox.resend = replay, resubmit or requeue; outbox.id
//	outbox check <topic>     internal   the middleware's check of the record before the handler; outbox.check = its outcome
//	outbox complete <topic>  internal   the completion after the handler succeeded or dropped the message
//
// Each carries messaging.destination.name (the topic), the record id
// (outbox.id, the value of the outbox_id metadata) and, on the delivery side,
// the consumer (outbox.consumer).
//
// # The trace context, whatever the decorator order
//
// The publish span starts inside the outbox's publisher decorator, before the
// record is saved, as a child of the message context's span (or of a trace
// context that a tracing decorator outside the outbox one already put into
// the metadata), and the propagator injects it into the message metadata
// ([TracerConfig.Propagator]; W3C traceparent with propagation.TraceContext).
// So the record keeps the trace context even when a tracing decorator sits
// inside the outbox one and injects its own only into what it sends, and a
// transactional publish ([outbox.TxPublisher]) keeps it too. The save and the
// send run in the publish span's context, so a tracing decorator inside the
// outbox one, and a database driver that traces, make child spans of it.
//
// # Replay continues the original trace
//
// A resend (startup replay, the stale resubmitter, a requeue) is a child
// span of the trace context saved with the record, and the message it sends
// carries the resend span's context, so the receiver's check, handler and
// completion are its children: publish, crash, restart, replay and handling
// read as one trace under the publish span. The resend span links to the
// sender's own span, when the context given to Replay or ResubmitOnce has
// one (a startup span, say).
//
// A child rather than a new trace linked to the old one, because the trace
// is what an operator follows: the trace id found in the publisher's logs
// leads to the handling, however many restarts later, and a parent-based
// sampler keeps or drops a message's whole story together. The cost is a
// trace that can last as long as the record stays pending (a replay after
// an outage, hours later); backends show it as one trace with a gap, and the
// link keeps the replay's own context reachable.
//
// # The delivery side
//
// The middleware continues the span of the message's context when a
// tracing middleware outside the outbox one already started it, and
// otherwise the trace context the message carries. The handler sees that
// context as msg.Context(), so its own spans join the trace; the check and
// the completion are its child spans. The middleware adds no span of the
// handling itself, which is a tracing middleware's to add.
//
// # Metrics
//
// [Metrics] is an [observe.Observer] with the names and labels of the
// outboxmetrics package's Prometheus collector: per tracked topic (attribute
// "topic") and, for what happens to a delivery, per consumer ("consumer").
// Instrument names are dot-joined ([MetricsConfig.Namespace],
// [MetricsConfig.Subsystem], name), so that an exporter to Prometheus gives
// the outboxmetrics names (dots to underscores, "_total" on counters,
// "_seconds" from the unit "s"):
//
//	outbox.records_published              counter  tracked messages saved and sent
//	outbox.records_completed               counter  deliveries completed after their handler (per consumer)
//	outbox.duplicates_skipped             counter  copies acknowledged without handling (per consumer)
//	outbox.handler_failures               counter  handler failures (per consumer)
//	outbox.records_abandoned              counter  deliveries abandoned after MaxAttempts (per consumer)
//	outbox.records_resent                 counter  records sent again (kind: replay, resubmit, requeue)
//	outbox.not_owned                      counter  messages of another table, topic or consumer, handled untracked
//	outbox.unknown_records                counter  messages naming a record the table does not have
//	outbox.mismatched_messages            counter  messages naming a record saved for another message (another UUID)
//	outbox.pending_records                gauge    records waiting to be completed
//	outbox.oldest_pending_age             gauge    age of the oldest pending record, in seconds
//	outbox.consumer_pending_records       gauge    records a declared consumer has still to complete
//	outbox.consumer_oldest_pending_age    gauge    age of the oldest of them, in seconds
//	outbox.status_read_errors             gauge    1 when the last collection could not read the backlog
//
// The gauges are read from the pending records of each store at each
// collection, within [MetricsConfig.ReadTimeout].
package outboxotel
