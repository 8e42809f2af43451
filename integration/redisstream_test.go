package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/wmoutbox/outbox/integration/scenarios"
	"github.com/wmoutbox/outbox/internal/testenv"
)

func TestRedisStream(t *testing.T) {
	t.Parallel()
	addr := env("OUTBOX_TEST_REDIS_ADDR", "127.0.0.1:6379")
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := admin.Ping(ctx).Err(); err != nil {
		testenv.Unavailable(t, "Redis", err)
	}

	scenarios.Run(t, scenarios.Backend{
		Name:    "Redis Streams",
		Records: records(t, "SQLite"),
		Connect: func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			// Publisher and subscriber close their clients; each gets one.
			pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{
				Client: redis.NewClient(&redis.Options{Addr: addr}),
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatalf("redis publisher: %v", err)
			}
			sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client:        redis.NewClient(&redis.Options{Addr: addr}),
				ConsumerGroup: group,
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatalf("redis subscriber: %v", err)
			}
			return connected(t, pub, sub)
		},
		Remove: func(t *testing.T, topic, _ string) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// The stream is the topic; its consumer groups go with it.
			if err := admin.Del(ctx, topic).Err(); err != nil {
				t.Logf("delete stream %s: %v", topic, err)
			}
		},
	})
}
