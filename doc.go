// Package outbox makes any Watermill publisher and router deliver tracked
// messages at least once, with each message's record kept in the service's own
// SQL table, completed by the receiver and replayed at startup.
//
// # How it works
//
// A [Registry] names the tracked topics ([Tracked]) and the store each one
// saves into (sqlstore provides them). Anything not registered passes through
// untouched, at the cost of one map lookup.
//
//  1. The publisher decorator ([NewPublisher], [PublisherDecorator]) inserts one
//     record per tracked message on the store's own connection, committed on
//     its own, stamps the record id, the topic and the table's identity into
//     the metadata ([MetadataID], [MetadataTopic], [MetadataStore]) and then
//     calls the wrapped publisher. If the insert fails nothing is sent, and
//     nothing is saved unless the error matches [ErrOutcomeUnknown] (the
//     connection was lost while the commit was on its way); if the send
//     fails the record stays pending.
//  2. The router middleware ([NewMiddleware]) admits a delivered message when
//     its record is this service's (its table is the store of the topic the
//     handler subscribed to) and still pending for this consumer, runs the
//     handler, and completes the consumer's delivery when the handler
//     succeeds or drops the message ([Drop]). A copy the consumer already
//     completed is acknowledged without running the handler.
//  3. Startup replay ([ReplayPlugin], [Replay]) republishes every pending
//     record once the router's subscriptions are open.
//
// The guarantee: every publish that returned nil, or that returned an error
// after the insert, is delivered at least once to each receiver and completed
// by it.
//
// # Several receivers
//
// A topic received by several handlers (two handlers in one router, two
// consumer groups or queues, two services) declares them in
// [Tracked.Consumers]: each consumer checks and completes its own delivery,
// and the record is complete once all have. Without a declaration a topic has
// one receiver; a second handler is reported and runs untracked, so it skips
// nothing.
//
// Consumers may be added while records are pending: each declared consumer
// handles every pending record once. A consumer removed, or the old name of
// a renamed one, is reported at start while it has pending deliveries, and
// [RetireConsumer] (or outboxctl retire) completes them; see
// docs/operations.md.
//
// # Receivers in other services
//
// Receivers in services with databases of their own are declared in
// [Tracked.RemoteConsumers]. Their middleware, given an inbox
// ([MiddlewareConfig.Inbox]) and a publisher ([MiddlewareConfig.Confirmations]),
// skips copies its consumer has handled and confirms each handled message
// over the broker; [AddConfirmationHandler] completes the sender's delivery
// from the confirmation, only when it names the record's table, topic, id,
// message UUID and a declared remote consumer. [InboxTx] commits the inbox
// entry with the handler's own writes, so that the effect happens once in
// the receiver's database. A failed handling is reported to the sender,
// which counts it toward its [MiddlewareConfig.MaxAttempts]; a copy lost
// on its way, or its confirmation, is sent again after
// [StaleResubmitterConfig.ConfirmWithin]. For receivers that do not run the outbox,
// [OnSend] completes a record once the wrapped publisher accepted it. A
// topic whose records nothing will complete is reported at start.
//
// # Bounded delivery
//
// No message makes a consumer spin and no slow database makes it hang: the
// check has a deadline ([MiddlewareConfig.CheckTimeout]), and a failed check
// holds its message for a growing delay before the nack
// ([MiddlewareConfig.CheckRetryDelay]); a failed attempt
// makes the delivery due again only after [MiddlewareConfig.Backoff], kept
// with the record so it survives restarts; a panic counts as a failed
// attempt; [MiddlewareConfig.MaxAttempts] abandons; a malformed record id is
// handled once, untracked, with an error line. Publish, replay, the stale
// resubmitter, the cleaner and [ReadStatus] bound each database statement
// that has no deadline of its own ([DefaultStatementTimeout], and the
// StatementTimeout of their configurations), so a database that never
// answers fails them instead of hanging them.
//
// # Order by key
//
// A topic with [Tracked.OrderKey] is handled in order per key and consumer:
// a record whose earlier record of the same key is not complete for the
// consumer is held (checked in the same statement as the record) and put
// back, and sent again once the key is free. Keys are not ordered against
// each other, and receivers in other services are not ordered. See
// docs/guarantees.md.
//
// # Middleware order
//
// Add the outbox middleware before (outside of) Watermill's Retry and of a
// PoisonQueue that diverts dropped messages ([IsDrop]); put a
// PoisonQueueWithFilter(pub, topic, [IsAbandoned]) outside it to divert
// abandoned ones. Recoverer may sit on either side. docs/how-it-works.md has a
// row per order a user meets, each with its test.
//
// # Transactions and exactly-once effects
//
// Three opt-in modes go beyond the default when the business data lives in
// the record's database:
//
//   - [TxPublisher] saves the records inside the caller's transaction, so they
//     commit or roll back with the business rows, and sends the messages after
//     the commit ([PublishingTx.Commit], or the [SendFunc] of
//     [TxPublisher.PublishTx]).
//   - [CompleteTx] completes the record inside the handler's transaction,
//     locking it, so that of two copies handled at once only one has an
//     effect; the middleware then skips its own completion.
//   - A store with a delivery lease (sqlstore's Config.Lease) claims the
//     record before the handler runs; a copy delivered meanwhile is nacked
//     with a [*CheckError].
//
// # Operations
//
// [StaleResubmitter] resends records that stay pending while the service
// runs, [Requeue] revives an abandoned record, [Cleaner] deletes old
// completed records, [NewStatusHandler] and [ReadStatus] report the backlog,
// [Registry.SetObserver] feeds metrics (the outboxmetrics package has
// Prometheus collectors; [Observers] combines several), and
// [Registry.SetTracer] follows each tracked message with its context for
// distributed tracing (the outboxotel module implements it, and the metrics,
// with OpenTelemetry).
//
// # Stores
//
// The sqlstore package provides the record tables for PostgreSQL,
// MySQL/MariaDB and SQLite. The contract between the outbox and a store is
// the recordstore package; what a store supports beyond the required methods
// is found through its optional interfaces.
//
// # Test builds
//
// Inside a Go test binary the registry passes everything through untracked
// unless the environment variable WATERMILL_OUTBOX is "on" when the registry is
// built (see [EnvToggle]); the first middleware or replay built on such a
// registry says so once at Info. A normal binary always tracks and never
// reads the variable. [NewTrackingRegistry] builds a registry that tracks
// in a test binary without the variable, for tests that run in parallel.
package outbox
