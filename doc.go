// Package outbox makes any Watermill publisher and router deliver tracked
// messages at least once, with each message's record kept in the service's own
// SQL table, completed by the receiver and replayed at startup.
//
// # How it works
//
// A [Registry] names the tracked topics and the [recordstore.Store] each one saves into.
// Anything not registered passes through untouched, at the cost of one map
// lookup.
//
//  1. The publisher decorator ([NewPublisher], [PublisherDecorator]) inserts one
//     record per tracked message on the store's own connection, committed on
//     its own, stamps the record id into the metadata ([MetadataID],
//     [MetadataTopic]) and then calls the wrapped publisher. If the insert fails
//     nothing is sent; if the send fails the record stays pending.
//  2. The router middleware ([NewMiddleware]) checks that the record of a
//     delivered message is still pending, runs the handler, and completes the
//     record when the handler succeeds or drops the message ([Drop]). A copy of
//     an already completed record is acknowledged without running the handler.
//  3. Startup replay ([ReplayPlugin], [Replay]) republishes every pending
//     record through the undecorated publisher once the router's subscriptions
//     are open.
//
// The guarantee: every publish that returned nil, or that returned an error
// after the insert, is delivered at least once and completed by a receiver.
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
//     with a [*FetchError].
//
// The stores say what they support through [recordstore.TxInserter], [recordstore.TxCompleter] and
// [recordstore.Releaser]; docs/guarantees.md compares the modes and their costs.
//
// # Stores
//
// The sqlstore package provides the record tables for PostgreSQL, MySQL/MariaDB
// and SQLite. Any type that implements [recordstore.Store] works; one that also implements
// [recordstore.Verifier] is checked before the startup replay.
//
// # Middleware order
//
// Add the outbox middleware before (outside of) Watermill's PoisonQueue and
// Retry middleware: the record is completed when the inner chain acknowledges,
// so a message diverted to a poison queue is completed and never replayed.
// With [MiddlewareConfig.MaxAttempts] set, a record is abandoned after its
// last failed try and the middleware returns an [*AbandonedError]: put a
// PoisonQueueWithFilter(pub, topic, [IsAbandoned]) outside it to divert such
// messages.
//
// # Operations
//
// [StaleResubmitter] resends records that stay pending while the service
// runs, [Cleaner] deletes old completed records, [NewStatusHandler] serves the
// backlog as JSON, and [Registry.SetObserver] feeds metrics (the
// outboxmetrics package has Prometheus collectors). They use the stores'
// optional interfaces: [recordstore.FailureRecorder], [recordstore.StaleClaimer], [recordstore.SendStamper],
// [recordstore.Cleaner], [recordstore.StatusReader] and [recordstore.Requeuer].
//
// # Test builds
//
// Inside a Go test binary the registry passes everything through untracked
// unless the environment variable WATERMILL_OUTBOX is "on" when the registry is
// built (see [EnvToggle]), so handlers can be unit-tested without a database. A
// normal binary always tracks and never reads the variable.
package outbox
