// Package outboxops is what an operator of a service with the outbox
// calls: the [Cleaner] of completed records and inbox entries, the status
// of every tracked topic ([ReadStatus]) and its HTTP handler
// ([NewStatusHandler]), the [Requeue] of an abandoned record and the retire
// of a consumer no longer declared ([RetireConsumer]). The command
// outboxctl and the dashboard outboxui build on it; docs/operations.md
// says when to use each.
package outboxops
