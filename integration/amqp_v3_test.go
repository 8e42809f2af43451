package integration_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	amqp3 "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/wmoutbox/outbox/integration/scenarios"
	"github.com/wmoutbox/outbox/internal/testenv"
)

// TestAMQPv3 runs the suite on watermill-amqp v3, the current major, beside
// TestAMQP on v2 (the one the design pins). The topology is the same durable
// pub/sub one; the exchange and queue names carry a "_amqpv3" suffix so the
// two runs never share an exchange or a queue on the broker.
func TestAMQPv3(t *testing.T) {
	t.Parallel()
	uri := env("OUTBOX_TEST_AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/")
	admin, err := amqp091.Dial(uri)
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	t.Cleanup(func() { _ = admin.Close() })

	const suffix = "_amqpv3"
	config := func(group string) amqp3.Config {
		c := amqp3.NewDurablePubSubConfig(uri, amqp3.GenerateQueueNameTopicNameWithSuffix(group+suffix))
		c.Exchange.GenerateName = func(topic string) string { return topic + suffix }
		return c
	}
	scenarios.Run(t, scenarios.Backend{
		Name:    "AMQP v3",
		Records: records(t, "Postgres"),
		Connect: func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			pub, err := amqp3.NewPublisher(config(group), watermill.NopLogger{})
			if err != nil {
				t.Fatalf("amqp v3 publisher: %v", err)
			}
			sub, err := amqp3.NewSubscriber(config(group), watermill.NopLogger{})
			if err != nil {
				t.Fatalf("amqp v3 subscriber: %v", err)
			}
			return connected(t, pub, sub)
		},
		Remove: func(t *testing.T, topic, group string) {
			ch, err := admin.Channel()
			if err != nil {
				t.Logf("amqp channel: %v", err)
				return
			}
			defer ch.Close()
			if _, err := ch.QueueDelete(config(group).Queue.GenerateName(topic), false, false, false); err != nil {
				t.Logf("delete queue: %v", err)
			}
			if err := ch.ExchangeDelete(config(group).Exchange.GenerateName(topic), false, false); err != nil {
				t.Logf("delete exchange: %v", err)
			}
		},
	})
}
