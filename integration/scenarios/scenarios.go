// Package scenarios is the end-to-end outbox suite, written once and run
// against every Watermill pub/sub: each scenario publishes through the
// outbox, runs a router with the outbox adopted on a real broker, and
// asserts what the handler ran for and what the record table holds
// afterwards.
//
// The test binary must set [outbox.EnvToggle] to "on" before it runs the
// suite (in TestMain), as the plugin tracks nothing in tests otherwise.
package scenarios

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/recordstore"
)

// Run runs every scenario against the backend, in parallel subtests.
func Run(t *testing.T, b Backend) {
	for _, sc := range []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"TrackedMessagesAreHandledOnceAndCompleted", trackedHandledOnce},
		{"DuplicateOfCompletedIsAckedWithoutHandler", duplicateAcked},
		{"HandlerErrorIsRedeliveredUntilSuccess", handlerErrorRedelivered},
		{"FailedSendIsDeliveredByNextReplay", failedSendReplayed},
		{"CrashAfterInsertBeforeSendIsRecoveredByReplay", crashRecovered},
		{"RecordIDAndNameSurviveTheMarshaler", metadataSurvives},
		{"UntrackedMessagesPassThroughUntouched", untrackedPassThrough},
		{"TwoConsumersEachHandleEveryMessage", twoConsumersEachHandleEveryMessage},
		{"TwoUndeclaredHandlersLoseNothing", twoUndeclaredHandlersLoseNothing},
		{"TwoServicesShareATopic", twoServicesShareATopic},
		{"DeclaredConsumerDownIsServedByReplay", consumerDownIsServedByReplay},
		{"ServicesWithADatabaseEachConfirmOverTheBroker", servicesWithADatabaseEach},
		{"CompletedOnSendDrainsAsSendsSucceed", completedOnSend},
		{"KeysAreHandledInOrderAcrossFailuresAndRestarts", orderedAcrossFailuresAndRestarts},
		{"ServicesWithADatabaseEachKeepKeysInOrderAtARemoteConsumer", keysInOrderAtARemoteConsumer},
		{"FastPathTwoConsumersDrain", fastPathDrains},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.fn(t, newEnv(t, b))
		})
	}
}

// newMessages returns n messages with JSON payloads (the SQL pub/sub's
// default column type is JSON) and a metadata key of their own.
func newMessages(prefix string, n int) ([]*message.Message, []string) {
	msgs := make([]*message.Message, n)
	uuids := make([]string, n)
	for i := range msgs {
		uuids[i] = fmt.Sprintf("%s-%d", prefix, i+1)
		msgs[i] = message.NewMessage(uuids[i], []byte(fmt.Sprintf(`{"order":%q}`, uuids[i])))
		msgs[i].Metadata.Set("trace_id", "trace-"+uuids[i])
	}
	return msgs, uuids
}

func completedAll(uuids ...string) map[string]bool {
	m := make(map[string]bool, len(uuids))
	for _, u := range uuids {
		m[u] = true
	}
	return m
}

func trackedHandledOnce(t *testing.T, e *env) {
	svc := e.startService(succeed, e.topic)
	pub, _ := e.connect()
	msgs, uuids := newMessages("order", 3)
	require.NoError(t, e.tracked(pub).Publish(e.topic, msgs...))

	got := svc.handledOnce(uuids...)
	svc.stop()

	svc.assertRanOnce(uuids...)
	for _, u := range uuids {
		assert.Equal(t, fmt.Sprintf(`{"order":%q}`, u), got[u].Payload)
	}
	e.requireTable(completedAll(uuids...))
}

func duplicateAcked(t *testing.T, e *env) {
	svc := e.startService(succeed, e.topic)
	pub, _ := e.connect()
	msgs, uuids := newMessages("dup", 1)
	require.NoError(t, e.tracked(pub).Publish(e.topic, msgs...))
	// The published message now carries its record id, as any copy the
	// broker or a producer resends would.
	dup := msgs[0].Copy()
	require.NotEmpty(t, dup.Metadata.Get(outbox.MetadataID))
	svc.handledOnce(uuids...)
	e.requireTable(completedAll(uuids...))

	require.NoError(t, pub.Publish(e.topic, dup), "re-send through the raw publisher")
	d := svc.next()
	require.Equal(t, dup.UUID, d.UUID)
	assert.Equal(t, dup.Metadata.Get(outbox.MetadataID), d.Received.Get(outbox.MetadataID), "the copy carries the record id")
	assert.False(t, d.Ran, "handler must not run for a copy of a completed record")
	assert.NoError(t, d.Err, "the copy is acked")
	svc.stop()

	assert.Equal(t, 1, svc.runCount(dup.UUID))
	e.requireTable(completedAll(uuids...))
}

var errTransient = errors.New("transient failure")

func handlerErrorRedelivered(t *testing.T, e *env) {
	// What the table held while the redelivery ran: the first run's error
	// must have left the record pending.
	var atRetry []row
	var atRetryErr error
	failFirst := func(_ *message.Message, run int) error {
		if run == 1 {
			return errTransient
		}
		atRetry, atRetryErr = e.readRows()
		return nil
	}
	svc := e.startService(failFirst, e.topic)
	pub, _ := e.connect()
	msgs, uuids := newMessages("retry", 1)
	require.NoError(t, e.tracked(pub).Publish(e.topic, msgs...))

	first := svc.next()
	require.Equal(t, uuids[0], first.UUID)
	require.True(t, first.Ran)
	require.ErrorIs(t, first.Err, errTransient, "the handler's error nacks the message")

	second := svc.handledOnce(uuids...)[uuids[0]]
	assert.Equal(t, first.Received.Get(outbox.MetadataID), second.Received.Get(outbox.MetadataID), "the redelivery carries the record id")
	svc.stop()

	assert.Equal(t, 2, svc.runCount(uuids[0]), "failed once, then succeeded")
	require.NoError(t, atRetryErr)
	require.Len(t, atRetry, 1)
	assert.False(t, atRetry[0].Completed, "pending while the redelivery runs")
	e.requireTable(completedAll(uuids...))
}

func failedSendReplayed(t *testing.T, e *env) {
	broken, _ := e.connect()
	require.NoError(t, broken.Close())
	msgs, uuids := newMessages("unsent", 2)
	err := e.tracked(broken).Publish(e.topic, msgs...)
	var sendErr *outbox.SendError
	require.ErrorAs(t, err, &sendErr, "a closed %s publisher fails the send after the insert", e.backend.Name)
	e.requireTable(map[string]bool{uuids[0]: false, uuids[1]: false})

	svc := e.startService(succeed, e.topic) // the next start replays
	svc.handledOnce(uuids...)
	svc.stop()

	svc.assertRanOnce(uuids...)
	e.requireTable(completedAll(uuids...))
}

// crashRecovered saves records as the decorator does and never sends them,
// which is what a process killed between insert and send leaves behind, and
// starts a fresh router and subscriber as the restarted process. The first
// restart is also the first start, so replay must reach a consumer group,
// durable or queue that the start itself creates; the second restarts on
// what the first left behind.
func crashRecovered(t *testing.T, e *env) {
	var all []string
	for _, crash := range []string{"first-start", "restart"} {
		msgs, uuids := newMessages(crash, 3)
		records := make([]recordstore.Record, len(msgs))
		for i, m := range msgs {
			records[i] = recordstore.Record{Topic: e.topic, UUID: m.UUID, Payload: m.Payload, Metadata: m.Metadata}
		}
		require.NoError(t, e.store.Insert(e.ctx(), records))
		pending := completedAll(all...)
		for _, u := range uuids {
			pending[u] = false
		}
		e.requireTable(pending)

		svc := e.startService(succeed, e.topic)
		svc.handledOnce(uuids...)
		svc.stop()

		svc.assertRanOnce(uuids...)
		all = append(all, uuids...)
		e.requireTable(completedAll(all...))
	}
}

// metadataSurvives checks that the broker's marshaler carries the record id,
// tracked topic and table identity both for a replayed message and for a
// live publish, and that the handler gets the message's own metadata
// without them.
func metadataSurvives(t *testing.T, e *env) {
	replayed := message.NewMessage("meta-replayed", []byte(`{"order":"replayed"}`))
	replayed.Metadata.Set("tenant", "acme")
	require.NoError(t, e.store.Insert(e.ctx(), []recordstore.Record{{Topic: e.topic, UUID: replayed.UUID, Payload: replayed.Payload, Metadata: replayed.Metadata}}))

	svc := e.startService(succeed, e.topic)
	pub, _ := e.connect()
	live := message.NewMessage("meta-live", []byte(`{"order":"live"}`))
	live.Metadata.Set("tenant", "globex")
	live.Metadata.Set("trace_id", "t-1")
	require.NoError(t, e.tracked(pub).Publish(e.topic, live))

	got := svc.handledOnce(replayed.UUID, live.UUID)
	svc.stop()
	identity, err := e.store.Identity(e.ctx())
	require.NoError(t, err)

	for _, m := range []*message.Message{replayed, live} {
		d := got[m.UUID]
		id := e.recordID(m.UUID)
		assert.Equal(t, fmt.Sprint(id), d.Received.Get(outbox.MetadataID), "%s: record id as delivered", m.UUID)
		assert.Equal(t, e.topic, d.Received.Get(outbox.MetadataTopic), "%s: tracked topic as delivered", m.UUID)
		assert.Equal(t, identity, d.Received.Get(outbox.MetadataTable), "%s: table identity as delivered", m.UUID)
		assert.True(t, d.Tracked, "%s: handler sees the record", m.UUID)
		assert.Equal(t, outbox.RecordRef{Topic: e.topic, ID: id, Consumer: "handle_" + e.topic}, d.Record)
		assert.Equal(t, string(m.Payload), d.Payload)
		for k, v := range m.Metadata {
			if k == outbox.MetadataID || k == outbox.MetadataTopic || k == outbox.MetadataTable {
				continue
			}
			assert.Equal(t, v, d.Seen.Get(k), "%s: metadata %q", m.UUID, k)
		}
		assert.NotContains(t, d.Seen, outbox.MetadataID, "the handler does not see the outbox keys")
		assert.NotContains(t, d.Seen, outbox.MetadataTopic)
		assert.NotContains(t, d.Seen, outbox.MetadataTable)
	}
	e.requireTable(completedAll(replayed.UUID, live.UUID))
}

func untrackedPassThrough(t *testing.T, e *env) {
	svc := e.startService(succeed, e.topic, e.plain)
	pub, _ := e.connect()
	msgs, uuids := newMessages("plain", 2)
	require.NoError(t, e.tracked(pub).Publish(e.plain, msgs...))

	got := svc.handledOnce(uuids...)
	svc.stop()

	for i, u := range uuids {
		d := got[u]
		assert.Equal(t, e.plain, d.Topic)
		assert.False(t, d.Tracked, "no record for an untracked message")
		assert.NotContains(t, d.Received, outbox.MetadataID)
		assert.NotContains(t, d.Received, outbox.MetadataTopic)
		assert.NotContains(t, d.Received, outbox.MetadataTable)
		assert.Equal(t, msgs[i].Metadata.Get("trace_id"), d.Seen.Get("trace_id"))
		assert.Equal(t, string(msgs[i].Payload), d.Payload)
		assert.NotContains(t, msgs[i].Metadata, outbox.MetadataID, "the publisher leaves untracked messages as they are")
	}
	e.requireTable(map[string]bool{})
}
