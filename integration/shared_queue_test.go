package integration_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestAMQPDeclaredConsumersSharingAQueueAreReported: two declared consumers
// of a tracked topic, in one router, subscribed through one AMQP subscriber
// (so one queue: they would split the messages) are reported at start.
func TestAMQPDeclaredConsumersSharingAQueueAreReported(t *testing.T) {
	t.Parallel()
	uri := env("OUTBOX_TEST_AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/")
	admin, err := amqp091.Dial(uri)
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	b := testenv.Backends()[1]
	store := testenv.NewStore(t, b, b.Open(t), sqlstore.Mark)
	topic := "shared_" + testenv.Table(t)
	config := amqp.NewDurablePubSubConfig(uri, amqp.GenerateQueueNameTopicNameWithSuffix("svc"))
	sub, err := amqp.NewSubscriber(config, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = sub.Close()
		if ch, err := admin.Channel(); err == nil {
			_, _ = ch.QueueDelete(config.Queue.GenerateName(topic), false, false, false)
			_ = ch.ExchangeDelete(config.Exchange.GenerateName(topic), false, false)
			_ = ch.Close()
		}
	})
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store, Consumers: []string{"email", "stats"}})
	require.NoError(t, err)
	logger := &testenv.CaptureLogger{}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	replayTo := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}) // nothing is pending
	t.Cleanup(func() { _ = replayTo.Close() })
	router.AddPlugin(outbox.ReplayPlugin(reg, replayTo, outbox.ReplayConfig{}, logger))
	for _, c := range []string{"email", "stats"} {
		router.AddNoPublisherHandler(c, topic, sub, func(*message.Message) error { return nil })
	}
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		t.Fatalf("the router stopped before it ran: %v", err)
	}
	require.NoError(t, router.Close())
	require.NoError(t, <-runErr)
	errs := logger.Entries("error")
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0].Err.Error(), "share its queue or consumer group")
	assert.Contains(t, errs[0].Err.Error(), "amqp.Subscriber")
}
