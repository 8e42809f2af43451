package integration_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/wmoutbox/outbox/integration/scenarios"
)

func TestKafka(t *testing.T) {
	t.Parallel()
	// An in-process broker that speaks the Kafka protocol; it is gone when
	// the test ends, topics and groups with it.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	scenarios.Run(t, scenarios.Backend{
		Name:    "Kafka",
		Records: records(t, "SQLite"),
		Connect: func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			pub, err := kafka.NewPublisher(kafka.PublisherConfig{
				Brokers:   brokers,
				Marshaler: kafka.DefaultMarshaler{},
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatalf("kafka publisher: %v", err)
			}
			sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers:               brokers,
				Unmarshaler:           kafka.DefaultMarshaler{},
				OverwriteSaramaConfig: kafkaSubscriberConfig(),
				ConsumerGroup:         group,
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatalf("kafka subscriber: %v", err)
			}
			return connected(t, pub, sub)
		},
	})
}

// kafkaSubscriberConfig starts a new consumer group at the oldest offset.
// Subscribe returns before the group has joined, so with Sarama's default
// (the newest offset) a group that is new at startup would skip what replay
// sent in between.
func kafkaSubscriberConfig() *sarama.Config {
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	return c
}
