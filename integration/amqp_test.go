package integration_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/wmoutbox/outbox/integration/scenarios"
	"github.com/wmoutbox/outbox/internal/testenv"
)

func TestAMQP(t *testing.T) {
	t.Parallel()
	uri := env("OUTBOX_TEST_AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/")
	admin, err := amqp091.Dial(uri)
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	t.Cleanup(func() { _ = admin.Close() })

	// The durable pub/sub topology: an exchange per topic and a queue per
	// topic and consumer group, bound when the subscriber subscribes. What
	// is published before that binding is dropped by RabbitMQ, which is why
	// replay waits for the subscriptions.
	config := func(group string) amqp.Config {
		return amqp.NewDurablePubSubConfig(uri, amqp.GenerateQueueNameTopicNameWithSuffix(group))
	}
	scenarios.Run(t, scenarios.Backend{
		Name:    "AMQP",
		Records: records(t, "Postgres"),
		Connect: func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			pub, err := amqp.NewPublisher(config(group), watermill.NopLogger{})
			if err != nil {
				t.Fatalf("amqp publisher: %v", err)
			}
			sub, err := amqp.NewSubscriber(config(group), watermill.NopLogger{})
			if err != nil {
				t.Fatalf("amqp subscriber: %v", err)
			}
			return connected(t, pub, sub)
		},
		Remove: func(t *testing.T, topic, group string) { deleteQueue(t, admin, config(group), topic) },
	})
}
