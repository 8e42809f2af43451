// Package outboxmetrics exposes the outbox as Prometheus metrics.
//
// [Collector] is a prometheus.Collector and an [observe.Observer]: register
// it with a Prometheus registry and give it to the outbox registry with
// [outbox.Registry.SetObserver] (with [observe.Observers] to report to
// another observer as well). Per tracked topic (label "topic"),
// and per consumer (label "consumer", the handler name) where a delivery is
// counted, it counts what the outbox did and, at each scrape, reads the
// backlog from the pending records of each store:
//
//	outbox_records_published_total               tracked messages saved and sent
//	outbox_records_completed_total                 deliveries completed after their handler (per consumer)
//	outbox_duplicates_skipped_total              copies acknowledged without handling (per consumer)
//	outbox_handler_failures_total                handler failures (per consumer)
//	outbox_records_abandoned_total               deliveries abandoned after MaxAttempts (per consumer)
//	outbox_records_resent_total{kind}            records sent again (kind: replay, resubmit, requeue)
//	outbox_not_owned_total                       messages of another table, topic or consumer, handled untracked
//	outbox_unknown_records_total                 messages naming a record the table does not have
//	outbox_mismatched_messages_total             messages naming a record saved for another message (another UUID)
//	outbox_confirmations_rejected_total          remote consumers' confirmations that completed nothing
//	outbox_inbox_business_key_duplicates_total   other services' messages skipped for a business key already handled
//	outbox_pending_records                       records waiting to be completed
//	outbox_oldest_pending_age_seconds            age of the oldest pending record
//	outbox_consumer_pending_records              records a declared consumer has still to complete
//	outbox_consumer_oldest_pending_age_seconds   age of the oldest of them
//
// Names follow Watermill's components/metrics: a configurable namespace, a
// subsystem, snake_case with the unit last, and "_total" on counters.
package outboxmetrics
