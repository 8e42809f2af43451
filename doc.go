// Package outbox makes any Watermill publisher and router deliver tracked
// messages at least once, with each message's record kept in the service's own
// SQL table, completed by the receiver and replayed at startup.
//
// # How it works
//
// A [Registry] names the tracked topics ([Tracked]) and the store each one
// saves into (sqlstore provides them); anything else passes through at the
// cost of one map lookup. The publisher ([NewPublisher],
// [PublisherDecorator]) saves a record per tracked message on the store's
// own connection, stamps its id into the metadata ([MetadataID]) and sends
// it; if the insert fails nothing is sent. The middleware ([NewMiddleware])
// skips a copy its consumer already completed, runs the handler, and
// completes the consumer's delivery when it succeeds or drops the message
// ([Drop]). [ReplayPlugin] resends every pending record at start, once the
// subscriptions are open, and what stays pending while the service runs.
// Every publish that returned nil, or an error after the insert, is
// delivered at least once to each receiver and completed by it:
// docs/guarantees.md lists each fault and its test.
//
// # Receivers in other services
//
// Consumers in services with databases of their own are declared in
// [Tracked.RemoteConsumers]; their middleware keeps an inbox
// ([MiddlewareConfig.Inbox], [InboxTx]) and confirms each handled message
// over the broker ([MiddlewareConfig.Confirmations]), which
// [AddConfirmationHandler] turns into the sender's completion.
//
// # Bounded delivery
//
// The check has a deadline and a failed one is held before its nack; a
// failed attempt is due again after a [Backoff] kept with the record;
// [MiddlewareConfig.MaxAttempts] abandons; every statement without a
// deadline of its own is bounded by [DefaultStatementTimeout].
//
// # Middleware order
//
// Add the outbox middleware outside Watermill's Retry and a PoisonQueue of
// dropped messages ([IsDrop]); a PoisonQueueWithFilter(pub, topic,
// [IsAbandoned]) outside it diverts abandoned ones. Recoverer may sit on
// either side. docs/how-it-works.md has a row per order, each with its test.
//
// # Test builds
//
// Inside a Go test binary the registry passes everything through untracked
// unless the environment variable [EnvToggle] is "on" when it is built, or
// it was built by [NewTrackingRegistry]. A normal binary always tracks.
package outbox
