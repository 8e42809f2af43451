// Package outboxui is the outbox's dashboard: an [http.Handler] that a
// service mounts in its own HTTP mux, next to its other endpoints, to show
// an operator the records of a [sqlstore.Store] and let them act on them.
//
//	ui, err := outboxui.New(store, outboxui.Config{Authorize: adminOnly, AllowedHosts: []string{"ops.example.com"}}, logger)
//	mux.Handle("/outbox/", http.StripPrefix("/outbox", ui))
//
// The command "outboxctl serve -dsn … -addr 127.0.0.1:8080" serves the
// same pages for any table.
//
// # Pages
//
//   - The overview: each topic and each consumer with its pending records,
//     the age of the oldest, its unchecked records (waiting for a receiver
//     never seen), when a receiver was last seen, a remote consumer's
//     deliveries awaiting confirmation with the oldest's age, its abandoned
//     records and those completed in the last hour; the backlog of the
//     last hour as a chart, computed from the records' own timestamps
//     (created, completed, abandoned), so that it survives restarts; the
//     resend and failure rates of the records completed in the last hour.
//   - The records: one topic's pending or abandoned records, optionally of
//     one consumer, a page at a time by id, through the table's indexes.
//   - A record: its metadata, its deliveries with their attempts, last error
//     and, while pending, next due time, and its payload as text or hex,
//     cut at [Config.PayloadLimit].
//   - The inbox, with [Config.Inbox]: its latest entries, each with its
//     consumer, the sender's identity and record, the message UUID and
//     when it was handled.
//
// Every page reads through the table's indexes (see [sqlstore.Operator.List]
// and [sqlstore.Operator.Activity]), never the whole table, so it answers as
// fast on a table of millions of completed records as on an empty one; the
// pending and abandoned records are read for the overview.
//
// # Actions
//
// With [Config.Actions] on, an operator can requeue an abandoned record
// (pending again, due at once for the service's outbox.StaleResubmitter),
// make a pending record due for it, and retire a consumer that its topic
// no longer declares (as outboxops.RetireConsumer does). Retire asks first:
// its page shows how many pending deliveries it would complete and when
// the consumer was last seen, and a second POST acts, whose page says how
// many it completed; a consumer that the latest start of the service
// declared is refused ([sqlstore.Store.Retire]). The dashboard never
// publishes: the service sends. Each action is a POST carrying a secret
// token of the process in a hidden field, refused without it and from
// another origin ([http.CrossOriginProtection]), and logged.
//
// # Security
//
// Mount the dashboard behind the service's own authentication: it shows
// payloads and, with actions on, changes records. [Config.Authorize] is
// called on every request before anything is read. A browser that can
// reach the dashboard can be led to it by a page of another site under a
// name of that site's own (DNS rebinding), whose Host and Origin a
// same-origin check accepts: set [Config.AllowedHosts] to the names the
// operators use, unless a proxy in front checks the Host, and wrap the
// server's other handlers in [Handler.Guard]. Errors are logged with
// their detail and shown as a generic message. Everything the pages need
// (templates, CSS) is embedded; they load nothing from elsewhere and use no
// JavaScript.
package outboxui
