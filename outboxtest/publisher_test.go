package outboxtest_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxtest"
)

// A receiving service's middleware publishes its confirmation from the
// router's handler, with the delivery's context, which ends when Deliver
// closes the router. The message that Sent returns outlives it: the
// sending service's confirmation handler takes it and completes the
// delivery.
func TestSentMessagesOutliveTheRouterThatPublishedThem(t *testing.T) {
	t.Parallel()
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	sender := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store, RemoteConsumers: []string{"billing"}})
	pub := outboxtest.NewPublisher(t, sender)
	require.NoError(t, pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("order-1"))))
	id := outboxtest.RequirePending(t, store, "orders", 1)[0].ID

	receiver := outboxtest.NewRegistry(t)
	confirmations := outboxtest.NewPublisher(t, receiver)
	cfg := outbox.MiddlewareConfig{Inbox: outboxtest.NewInbox(), Confirmations: confirmations}
	got := outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", ok, pub.Sent("orders")[0])
	require.True(t, got.Acked, "the receiver handled the message: %v", got.Err)
	sent := confirmations.Sent(outbox.DefaultConfirmTopic)
	require.Len(t, sent, 1, "the receiver confirmed")
	assert.NoError(t, sent[0].Context().Err(), "the confirmation's context has not ended with the router")

	confirm, err := outbox.NewConfirmationHandler(sender, outbox.ConfirmationHandlerConfig{}, nil)
	require.NoError(t, err)
	require.NoError(t, confirm(sent[0]))
	outboxtest.RequireCompleted(t, store, id)
}

// Each call of Sent returns new copies: a test that changes a message it
// got changes neither what the publisher keeps nor what the next call
// returns, nor does the code under test that changes a message after
// publishing it.
func TestSentReturnsNewCopies(t *testing.T) {
	t.Parallel()
	k := setup(t)
	published := message.NewMessage("order-1", []byte("payload"))
	published.Metadata.Set("region", "eu")
	require.NoError(t, k.pub.Publish("orders", published))
	published.Payload[0] = 'P'
	published.Metadata.Set("region", "us")

	first := k.pub.Sent("orders")[0]
	assert.Equal(t, "payload", string(first.Payload), "the payload as it was published")
	assert.Equal(t, "eu", first.Metadata.Get("region"), "the metadata as it was published")
	assert.NotEmpty(t, first.Metadata.Get(outbox.MetadataID), "with the outbox metadata")
	first.UUID = "changed"
	first.Payload[0] = 'X'
	first.Metadata.Set("region", "changed")
	first.Metadata.Set(outbox.MetadataID, "0")

	second := k.pub.Sent("orders")[0]
	assert.NotSame(t, first, second)
	assert.Equal(t, "order-1", second.UUID)
	assert.Equal(t, "payload", string(second.Payload))
	assert.Equal(t, "eu", second.Metadata.Get("region"))
	assert.Equal(t, outboxtest.Outcome{Acked: true, Tracked: true, Runs: 1}, outboxtest.Deliver(t, k.reg, "ship_orders", "orders", ok, second),
		"the copy still names its record")
}
