// Package outboxmetrics exposes the outbox as Prometheus metrics.
//
// [Collector] is a prometheus.Collector and an [outbox.Observer]: register
// it with a Prometheus registry and give it to the outbox registry with
// [outbox.Registry.SetObserver]. Per tracked name (label "outbox_name") it
// counts what the outbox did and, at each scrape, reads the backlog from the
// pending records of each store:
//
//	outbox_records_published_total      tracked messages saved and sent
//	outbox_records_handled_total        records completed after their handler
//	outbox_duplicates_skipped_total     copies acknowledged without handling
//	outbox_handler_failures_total       handler failures
//	outbox_records_abandoned_total      records abandoned after MaxAttempts
//	outbox_records_replayed_total       records sent again (replay, resubmit)
//	outbox_pending_records              records waiting to be completed
//	outbox_oldest_pending_age_seconds   age of the oldest pending record
//
// Names follow Watermill's components/metrics: a configurable namespace, a
// subsystem, snake_case with the unit last, and "_total" on counters.
package outboxmetrics
