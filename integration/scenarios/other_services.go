package scenarios

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// The scenarios of receivers in other services: each service has a
// database of its own (on SQLite a file of its own; on the servers a pool
// and tables of its own, so a table identity of its own), and the services
// meet only on the broker.

// remoteConsumers are the handlers of the receiving services B and C.
var remoteConsumers = []string{"billing", "shipping"}

// inboxOf opens a receiving service's own database and its inbox.
func (e *env) inboxOf(name string) *sqlstore.Inbox {
	e.t.Helper()
	_, in := e.databaseOf(name)
	return in
}

// databaseOf opens a receiving service's own database, with its inbox, for
// a handler that writes its effects there too.
func (e *env) databaseOf(name string) (*sqlx.DB, *sqlstore.Inbox) {
	e.t.Helper()
	db := e.backend.Records.Open(e.t)
	table := "inbox_" + randomHex(e.t, 5) + "_" + name
	in, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: e.backend.Records.Dialect, DB: db, Table: table})
	require.NoError(e.t, err)
	require.NoError(e.t, in.Migrate(e.ctx()))
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_, err := db.ExecContext(ctx, "DROP TABLE "+table)
		assert.NoError(e.t, err)
	})
	return db, in
}

// receivingService starts a service with a database of its own whose
// handler, named consumer, receives the tracked topic, deduplicated by its
// inbox and confirmed to the sender.
func (e *env) receivingService(consumer string) *service {
	e.t.Helper()
	reg, err := outbox.NewRegistry() // it tracks nothing of its own
	require.NoError(e.t, err)
	pub, sub := e.connectAs(consumer)
	return e.startServiceWith(serviceConfig{reg: reg, pub: pub, decide: succeed,
		receivers: []receiver{{name: consumer, topic: e.topic, sub: sub}},
		mw:        outbox.MiddlewareConfig{Inbox: e.inboxOf(consumer), Confirmations: pub}})
}

// servicesWithADatabaseEach: service A publishes a tracked topic whose
// receivers are services B and C, each with a database and an inbox of its
// own, declared as A's remote consumers. Every receiver handles every
// message once; A's table drains. While A is stopped, its confirmation
// subscriber closed, B and C handle a backlog and confirm it: A restarts
// without replay and completes the backlog from the confirmations its
// durable queue or group kept (on a volatile broker, which keeps nothing,
// A's replay resends the backlog and B and C confirm again). After every
// message is sent again, B and C run none a second time.
func servicesWithADatabaseEach(t *testing.T, e *env) {
	confirmTopic := "confirm_" + e.topic
	if e.backend.Remove != nil {
		t.Cleanup(func() { e.backend.Remove(t, confirmTopic, e.group+"_confirm") })
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: e.topic, Store: e.store, RemoteConsumers: remoteConsumers, ConfirmTopic: confirmTopic})
	require.NoError(t, err)
	e.reg = reg
	obs := newCounts()
	reg.SetObserver(obs)
	pub, _ := e.connect()
	// A's confirmation subscriber is of a group of its own, the same at
	// every start: a durable queue, consumer group or durable consumer.
	startA := func(replay bool) *service {
		_, confirmations := e.connectAs("confirm")
		return e.startServiceWith(serviceConfig{reg: reg, pub: pub, decide: succeed, confirmations: confirmations, noReplay: !replay})
	}
	a := startA(true)
	b, c := e.receivingService("billing"), e.receivingService("shipping")

	msgs, uuids := newMessages("order", 10)
	publish(t, e.tracked(pub), e.topic, msgs)
	b.handledByEach([]string{"billing"}, uuids)
	c.handledByEach([]string{"shipping"}, uuids)
	for _, consumer := range remoteConsumers {
		obs.waitFor(t, "handled", consumer, len(uuids))
	}
	e.requireTable(completedAll(uuids...))

	// A backlog: A is stopped, its confirmation subscriber closed, while
	// its code publishes 5 more. B and C handle them and confirm; each
	// confirmation is published before its message is acked, so once
	// both handled the backlog every confirmation is on the broker, and
	// nothing is complete yet.
	a.stop()
	backlog, backlogUUIDs := newMessages("backlog", 5)
	publish(t, e.tracked(pub), e.topic, backlog)
	b.handledByEach([]string{"billing"}, backlogUUIDs)
	c.handledByEach([]string{"shipping"}, backlogUUIDs)
	all := append(append([]string(nil), uuids...), backlogUUIDs...)
	whileDown := completedAll(uuids...)
	for _, u := range backlogUUIDs {
		whileDown[u] = false
	}
	e.requireTable(whileDown)
	if e.backend.Volatile {
		// The broker kept nothing for A's closed subscriber: the
		// confirmations are lost, A's start replays the backlog, and B
		// and C skip each copy and confirm it again.
		a = startA(true)
		b.skippedByEach([]string{"billing"}, backlogUUIDs)
		c.skippedByEach([]string{"shipping"}, backlogUUIDs)
	} else {
		// A's queue or group kept the confirmations: a start that sends
		// nothing again completes the backlog from them.
		a = startA(false)
	}
	for _, consumer := range remoteConsumers {
		obs.waitFor(t, "handled", consumer, len(all))
	}
	e.requireTable(completedAll(all...))

	// A forced resend of every message, with its original record and
	// UUID: both inboxes skip each copy and confirm it again.
	duplicates := map[string]int{}
	for _, consumer := range remoteConsumers {
		duplicates[consumer] = obs.get("duplicate", consumer)
	}
	resent := 0
	for _, d := range b.history {
		if d.Ran && d.Err == nil {
			copyMsg := message.NewMessage(d.UUID, []byte(d.Payload))
			copyMsg.Metadata = copyMetadata(d.Received)
			require.NoError(t, pub.Publish(e.topic, copyMsg))
			resent++
		}
	}
	require.Equal(t, len(all), resent)
	b.skippedByEach([]string{"billing"}, all)
	c.skippedByEach([]string{"shipping"}, all)
	for _, consumer := range remoteConsumers {
		// Each copy's confirmation reaches A as a duplicate.
		obs.waitFor(t, "duplicate", consumer, duplicates[consumer]+len(all))
	}
	a.stop()
	b.stop()
	c.stop()

	for _, u := range all {
		assert.Equal(t, 1, b.runsOf("billing", u), "billing ran for %s", u)
		assert.Equal(t, 1, c.runsOf("shipping", u), "shipping ran for %s", u)
	}
	e.requireTable(completedAll(all...))
	t.Logf("%s: A completed %d deliveries; duplicate confirmations billing %d, shipping %d", e.backend.Name,
		obs.get("handled", "billing")+obs.get("handled", "shipping"), obs.get("duplicate", "billing"), obs.get("duplicate", "shipping"))
}

// completedOnSend: a topic for a receiver that does not run the outbox
// (service B's router has no outbox middleware) completes each record as
// its send succeeds; a failed send stays pending and A's next replay sends
// and completes it.
func completedOnSend(t *testing.T, e *env) {
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: e.topic, Store: e.store, CompletedBy: outbox.OnSend})
	require.NoError(t, err)
	e.reg = reg
	pub, _ := e.connect()
	_, sub := e.connectAs("plain")
	b := e.startServiceWith(serviceConfig{reg: reg, plain: true, decide: succeed, receivers: []receiver{{name: "plain", topic: e.topic, sub: sub}}})

	msgs, uuids := newMessages("sent", 5)
	publish(t, e.tracked(pub), e.topic, msgs)
	e.requireTable(completedAll(uuids...)) // complete once the sends returned

	broken, _ := e.connect()
	require.NoError(t, broken.Close())
	lost := message.NewMessage("sent-lost", []byte(`{"order":"sent-lost"}`))
	var sendErr *outbox.SendError
	require.ErrorAs(t, e.tracked(broken).Publish(e.topic, lost), &sendErr, "a closed %s publisher fails the send after the insert", e.backend.Name)
	want := completedAll(uuids...)
	want["sent-lost"] = false
	e.requireTable(want)

	// A's next start replays it; the replay returns once it was sent and
	// completed.
	res, err := outbox.Replay(e.ctx(), reg, pub, outbox.ReplayConfig{}, nil)
	require.NoError(t, err)
	assert.Equal(t, 1, res.Total())
	want["sent-lost"] = true
	e.requireTable(want)
	b.handledByEach([]string{"plain"}, append(uuids, "sent-lost"))
	b.stop()
}
