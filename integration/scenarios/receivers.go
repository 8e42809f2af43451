package scenarios

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/recordstore"
)

// The scenarios of a tracked topic with several receivers. Each receiver
// gets every message the way the pub/sub fans out: its own subscriber of a
// GoChannel, its own queue on AMQP, its own consumer group on Kafka, NATS,
// Redis Streams and the SQL pub/sub.

// fanOutMessages is how many tracked messages a scenario with several
// receivers publishes.
const fanOutMessages = 50

// publishBatch is how many messages go into one Publish call, so that
// deliveries of one batch overlap the publish of the next.
const publishBatch = 10

func publish(t *testing.T, pub message.Publisher, topic string, msgs []*message.Message) {
	t.Helper()
	for len(msgs) > 0 {
		n := min(publishBatch, len(msgs))
		require.NoError(t, pub.Publish(topic, msgs[:n]...))
		msgs = msgs[n:]
	}
}

// receiversOf returns one handler per consumer, each on a subscriber of a
// group of its own.
func (e *env) receiversOf(consumers ...string) []receiver {
	out := make([]receiver, len(consumers))
	for i, c := range consumers {
		_, sub := e.connectAs(c)
		out[i] = receiver{name: c, topic: e.topic, sub: sub}
	}
	return out
}

func twoConsumersEachHandleEveryMessage(t *testing.T, e *env) {
	consumers := []string{"email", "stats"}
	e.declare(consumers...)
	obs := newCounts()
	e.reg.SetObserver(obs)
	logger := &testenv.CaptureLogger{}
	pub, _ := e.connect()
	svc := e.startServiceWith(serviceConfig{reg: e.reg, pub: pub, receivers: e.receiversOf(consumers...), decide: succeed, logger: logger})

	msgs, uuids := newMessages("fanout", fanOutMessages)
	publish(t, e.tracked(pub), e.topic, msgs)
	got := svc.handledByEach(consumers, uuids)
	svc.stop()

	for _, c := range consumers {
		for _, u := range uuids {
			d := got[runKey{c, u}]
			assert.True(t, d.Tracked, "%s handles %s tracked", c, u)
			assert.Equal(t, c, d.Record.Consumer, "%s: the delivery is the handler's own", u)
			assert.Equal(t, 1, svc.runsOf(c, u), "%s ran for %s", c, u)
		}
		assert.Equal(t, fanOutMessages, obs.get("handled", c), "%s completed its delivery of every record", c)
		t.Logf("%s: consumer %s handled %d of %d messages, %d copies skipped", e.backend.Name, c,
			countRuns(svc, c, uuids), len(uuids), obs.get("duplicate", c))
	}
	assert.Equal(t, len(consumers)*fanOutMessages, svc.totalRuns(), "no handler ran for a message twice")
	assert.Empty(t, logger.Entries("error"))
	e.requireTable(completedAll(uuids...))
	e.requireDeliveriesComplete(consumers, len(uuids))
}

// consumerDownIsServedByReplay: a declared consumer that is not running
// when the messages are published gets them from the next start's replay,
// because a record stays pending until every declared consumer completed
// it; the consumer that already handled them acks its copies without
// running.
//
// A pub/sub that gives a new consumer group what was published before it
// existed (Kafka, NATS, Redis Streams, SQL) delivers the late consumer both
// the original and the replayed copy. Handled one after the other, the
// second is skipped; delivered at once (Kafka spreads them over
// partitions), both may run, which is the at-least-once the outbox
// promises without a delivery lease. So the late consumer is held to at
// least once, and its extra runs are reported.
func consumerDownIsServedByReplay(t *testing.T, e *env) {
	const n = 10
	consumers := []string{"email", "stats"}
	e.declare(consumers...)
	obs := newCounts()
	e.reg.SetObserver(obs)
	pub, _ := e.connect()

	emailOnly := e.startServiceWith(serviceConfig{reg: e.reg, pub: pub, receivers: e.receiversOf("email"), decide: succeed})
	msgs, uuids := newMessages("down", n)
	publish(t, e.tracked(pub), e.topic, msgs)
	emailOnly.handledByEach([]string{"email"}, uuids)
	emailOnly.stop()

	waiting := map[string]bool{}
	for _, u := range uuids {
		waiting[u] = false
	}
	e.requireTable(waiting)
	sts, err := outboxops.ReadStatus(e.ctx(), e.reg, outboxops.StatusOptions{})
	require.NoError(t, err)
	require.Len(t, sts, 1)
	// stats has never run, so its deliveries are unchecked too.
	assert.Equal(t, []outboxops.ConsumerStatus{{Consumer: "stats", Pending: n, Unchecked: n, OldestPending: sts[0].Consumers[0].OldestPending}}, pendingOnly(sts[0].Consumers),
		"only stats has deliveries pending, and no stats has ever checked one")

	both := e.startServiceWith(serviceConfig{reg: e.reg, pub: pub, receivers: e.receiversOf(consumers...), decide: succeed})
	both.handledByEach([]string{"stats"}, uuids)
	// The replayed copies also reach email, which must not run them; how
	// many arrive before the stop depends on the broker (a Redis consumer
	// group can hold some back), so they are counted, not awaited.
	both.stop()

	extra := 0
	for _, u := range uuids {
		assert.Equal(t, 1, emailOnly.runsOf("email", u)+both.runsOf("email", u), "email ran for %s", u)
		assert.GreaterOrEqual(t, both.runsOf("stats", u), 1, "stats ran for %s", u)
		extra += both.runsOf("stats", u) - 1
	}
	t.Logf("%s: stats handled %d of %d messages after replay (%d extra runs), %d copies skipped; email ran for none again, skipped %d copies",
		e.backend.Name, countRuns(both, "stats", uuids), n, extra, obs.get("duplicate", "stats"), obs.get("duplicate", "email"))
	e.requireTable(completedAll(uuids...))
	e.requireDeliveriesComplete(consumers, n)
}

// pendingOnly returns the consumers with pending deliveries.
func pendingOnly(cs []outboxops.ConsumerStatus) []outboxops.ConsumerStatus {
	var out []outboxops.ConsumerStatus
	for _, c := range cs {
		if c.Pending > 0 {
			out = append(out, c)
		}
	}
	return out
}

// countRuns returns for how many of the messages the handler ran.
func countRuns(s *service, handler string, uuids []string) int {
	n := 0
	for _, u := range uuids {
		if s.runsOf(handler, u) > 0 {
			n++
		}
	}
	return n
}

// requireDeliveriesComplete asserts that no record is pending and that each
// declared consumer completed its delivery of each of the n records.
func (e *env) requireDeliveriesComplete(consumers []string, n int) {
	t := e.t
	t.Helper()
	ctx := e.ctx()
	pending, err := e.store.PendingAfter(ctx, e.topic, 0, n+1)
	require.NoError(t, err)
	assert.Empty(t, pending, "records pending after every consumer handled them")

	sts, err := outboxops.ReadStatus(ctx, e.reg, outboxops.StatusOptions{Full: true})
	require.NoError(t, err)
	require.Len(t, sts, 1)
	st := sts[0]
	assert.Zero(t, st.Pending)
	assert.EqualValues(t, n, st.Completed)
	byConsumer := map[string]outboxops.ConsumerStatus{}
	for _, cs := range st.Consumers {
		byConsumer[cs.Consumer] = cs
	}
	assert.Len(t, st.Consumers, len(consumers), "status per declared consumer: %+v", st.Consumers)
	for _, c := range consumers {
		cs := byConsumer[c]
		assert.Zero(t, cs.Pending, "%s: deliveries pending", c)
		assert.Zero(t, cs.Abandoned, "%s: deliveries abandoned", c)
		assert.EqualValues(t, n, cs.Completed, "%s: deliveries completed", c)
	}

	for _, c := range consumers {
		notCompleted := map[int64]error{}
		for _, r := range e.rows() {
			err := e.store.CheckPending(ctx, recordstore.Delivery{ID: r.ID, Topic: e.topic, Consumer: c})
			if !errors.Is(err, outbox.ErrNotPending) {
				notCompleted[r.ID] = err
			}
		}
		if len(notCompleted) > 0 {
			t.Errorf("deliveries to %s not complete: %s", c, firstFew(notCompleted))
		}
	}
}

// requireCompletedBy asserts that each record was completed by the consumer
// and that another consumer's copy is a conflict, not a duplicate.
func requireCompletedBy(t *testing.T, store recordstore.Store, topic string, rows []row, by, other string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	wrong := map[int64]error{}
	for _, r := range rows {
		if err := store.CheckPending(ctx, recordstore.Delivery{ID: r.ID, Topic: topic, Consumer: by}); !errors.Is(err, outbox.ErrNotPending) {
			wrong[r.ID] = fmt.Errorf("for %s: %w", by, err)
			continue
		}
		err := store.CheckPending(ctx, recordstore.Delivery{ID: r.ID, Topic: topic, Consumer: other})
		var conflict *recordstore.ConsumerConflictError
		if !errors.As(err, &conflict) || conflict.CompletedBy != by {
			wrong[r.ID] = fmt.Errorf("for %s: %w", other, err)
		}
	}
	if len(wrong) > 0 {
		t.Errorf("records not completed by %s alone: %s", by, firstFew(wrong))
	}
}

// firstFew describes a few records of a set found wrong, with the count.
func firstFew(byID map[int64]error) string {
	ids := slices.Sorted(maps.Keys(byID))
	var b strings.Builder
	fmt.Fprintf(&b, "%d records", len(ids))
	for _, id := range ids[:min(3, len(ids))] {
		fmt.Fprintf(&b, "; %d: %v", id, byID[id])
	}
	return b.String()
}

func twoUndeclaredHandlersLoseNothing(t *testing.T, e *env) {
	handlers := []string{"email", "stats"}
	obs := newCounts()
	e.reg.SetObserver(obs)
	logger := &testenv.CaptureLogger{}
	pub, _ := e.connect()
	svc := e.startServiceWith(serviceConfig{reg: e.reg, pub: pub, receivers: e.receiversOf(handlers...), decide: succeed, logger: logger})

	msgs, uuids := newMessages("undeclared", fanOutMessages)
	publish(t, e.tracked(pub), e.topic, msgs)
	got := svc.handledByEach(handlers, uuids)
	svc.stop()

	// The first handler to receive the topic is its receiver; the other
	// runs untracked from its first message on.
	trackedRuns := map[string]int{}
	for k, d := range got {
		if d.Tracked {
			trackedRuns[k.handler]++
			assert.Equal(t, k.handler, d.Record.Consumer)
		}
	}
	require.Len(t, trackedRuns, 1, "exactly one handler tracks the topic: %v", trackedRuns)
	receiver, second := handlers[0], handlers[1]
	if trackedRuns[second] > 0 {
		receiver, second = second, receiver
	}
	assert.Equal(t, fanOutMessages, trackedRuns[receiver], "%s tracks every message", receiver)
	for _, h := range handlers {
		for _, u := range uuids {
			assert.Equal(t, 1, svc.runsOf(h, u), "%s ran for %s", h, u)
		}
		t.Logf("%s: handler %s handled %d of %d messages (tracked %d), %d copies skipped", e.backend.Name, h,
			countRuns(svc, h, uuids), len(uuids), trackedRuns[h], obs.get("duplicate", h))
	}
	assert.Equal(t, len(handlers)*fanOutMessages, svc.totalRuns())
	assert.Equal(t, fanOutMessages, obs.get("handled", receiver))
	assert.Zero(t, obs.get("duplicate", second), "the second handler skipped nothing")

	errs := logger.Entries("error")
	require.Len(t, errs, 1, "the second handler is reported once: %+v", errs)
	text := errs[0].Msg + ": " + fmt.Sprint(errs[0].Err)
	for _, h := range handlers {
		assert.Contains(t, text, fmt.Sprintf("%q", h), "the error names both handlers")
	}

	e.requireTable(completedAll(uuids...))
	ctx := e.ctx()
	pending, err := e.store.PendingAfter(ctx, e.topic, 0, fanOutMessages+1)
	require.NoError(t, err)
	assert.Empty(t, pending)
	requireCompletedBy(t, e.store, e.topic, e.rows(), receiver, second)
}
