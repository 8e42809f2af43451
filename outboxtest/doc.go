// Package outboxtest is a kit for testing code that uses the outbox, as
// GoChannel is for Watermill and rivertest for river: an in-memory record
// store, a registry that tracks inside a test, a publisher that keeps what
// it sends, a way to run a handler through the outbox middleware, and
// assertions on what the store saved.
//
// # Tracking inside a test
//
// Inside a Go test binary a registry built by [outbox.NewRegistry] tracks
// nothing unless the environment variable WATERMILL_OUTBOX is "on" when it
// is built (see [outbox.EnvToggle]), so that handlers can be unit-tested
// without a database. A test that wants the outbox to track builds its
// registry with [NewRegistry], which tracks whatever the environment says
// and changes nothing in it, so such tests may call t.Parallel.
//
// # A test of a publisher and a handler
//
//	store := outboxtest.NewStore(outboxtest.StoreConfig{})
//	reg := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store})
//	pub := outboxtest.NewPublisher(t, reg)
//
//	// The code under test publishes; the outbox saved a record.
//	require.NoError(t, placeOrder(pub, "order-1"))
//	rec := outboxtest.RequirePublished(t, store, "orders")[0]
//
//	// The handler runs as the router's "ship_orders" and completes it.
//	got := outboxtest.Deliver(t, reg, "ship_orders", "orders", shipOrder, pub.Sent("orders")[0])
//	require.True(t, got.Acked)
//	outboxtest.RequireCompleted(t, store, rec.ID)
//
// [Deliver] runs the handler in a real Watermill router, under its handler
// name and subscribed topic, so declared consumers ([outbox.Tracked]),
// copies of completed records and failures behave as in production. The
// [Store] implements every optional interface of the recordstore package
// but the transaction ones, so the outbox's operational parts (the
// StaleResubmitter, the Cleaner, the status handler) run against it too.
//
// # An inbox
//
// A handler that deduplicates another service's messages takes a
// recordstore.Inbox; [NewInbox] is an in-memory one. A handler that saves
// the entry in its own transaction (MarkHandledTx) can be given a [Tx],
// whose Commit and Rollback the inbox follows:
//
//	inbox := outboxtest.NewInbox()
//	tx := outboxtest.NewTx()
//	err := inbox.MarkHandledTx(ctx, tx, recordstore.InboxEntry{Consumer: "billing", MessageUUID: msg.UUID})
//	// ... the handler fails and rolls back: the entry is gone.
//	_ = tx.Rollback()
//
// A [Tx] runs no SQL, so a handler that writes its effect in the
// transaction of its inbox entry ([outbox.InboxTx]) is tested on a real
// database instead: the [github.com/wmoutbox/outbox/outboxtest/sqlitetest]
// package opens an SQLite file in the test's temporary directory, with an
// inbox and the test's tables, in process and with no server.
//
// # The store contract
//
// [Store] passes the contract suite that every record store runs
// (sqlstore/storetest's RunContract), in both completion modes: what the
// middleware and the replay see from it is what they see from sqlstore.
// [Inbox] passes the inbox contract suite (RunInbox) in the same way.
package outboxtest
