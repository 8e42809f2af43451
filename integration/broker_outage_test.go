package integration_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/faultproxy"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestBrokerOutage cuts the TCP connection to the broker (Redis Streams) with
// a real proxy: tracked publishes return the broker's error and leave their
// records pending; after the broker is back, the next start replays them all.
//
// Redis rather than RabbitMQ: watermill-amqp's reconnect bookkeeping races
// with Publish (a data race inside the library that -race reports), while
// go-redis fails and reconnects cleanly.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	addr := env("OUTBOX_TEST_REDIS_ADDR", "127.0.0.1:6379")
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.Ping(context.Background()).Err(); err != nil {
		testenv.Unavailable(t, "Redis", err)
	}
	backend := records(t, "Postgres")
	db := backend.Open(t)
	store := testenv.NewStore(t, backend, db, sqlstore.Mark)
	topic := "outage_" + store.Table()
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store})
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Del(context.Background(), topic).Err() })

	proxy, err := faultproxy.New(addr)
	require.NoError(t, err)
	defer proxy.Close()
	rawViaProxy, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client: redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: 1}),
	}, watermill.NopLogger{})
	require.NoError(t, err)
	defer rawViaProxy.Close()
	pub, err := outbox.NewPublisher(reg, rawViaProxy)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(topic, message.NewMessage("before-outage", []byte("x"))), "the proxy forwards while it is up")

	proxy.Cut()
	uuids := []string{"before-outage"}
	for i := 0; i < 3; i++ {
		msg := message.NewMessage(fmt.Sprintf("during-outage-%d", i), []byte("x"))
		err := pub.Publish(topic, msg)
		var sendErr *outbox.SendError
		require.ErrorAs(t, err, &sendErr, "the broker's error reaches the caller")
		require.Len(t, sendErr.IDs, 1)
		pending, err := store.PendingAfter(context.Background(), topic, sendErr.IDs[0]-1, 1)
		require.NoError(t, err)
		require.Len(t, pending, 1, "its record stays pending")
		require.Equal(t, sendErr.IDs[0], pending[0].ID)
		uuids = append(uuids, msg.UUID)
	}
	proxy.Restore()
	require.NoError(t, pub.Publish(topic, message.NewMessage("after-outage", []byte("x"))), "the publisher recovers with the broker")
	uuids = append(uuids, "after-outage")

	// The next start, with the broker back, replays what the outage kept.
	rawPub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(&redis.Options{Addr: addr})}, watermill.NopLogger{})
	require.NoError(t, err)
	defer rawPub.Close()
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        redis.NewClient(&redis.Options{Addr: addr}),
		ConsumerGroup: "outage",
	}, watermill.NopLogger{})
	require.NoError(t, err)
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(mw)
	router.AddPlugin(outbox.ReplayPlugin(reg, rawPub, outbox.ReplayConfig{}, nil))
	var mu sync.Mutex
	handled := map[string]int{}
	done := make(chan struct{})
	router.AddNoPublisherHandler("outage", topic, sub, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled[msg.UUID]++
		if len(handled) == len(uuids) && handled[msg.UUID] == 1 {
			close(done)
		}
		return nil
	})
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	select {
	case <-done:
	case err := <-runErr:
		t.Fatalf("router stopped: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the records kept during the outage were not replayed")
	}
	require.NoError(t, router.Close())
	require.NoError(t, <-runErr)

	for _, id := range uuids {
		assert.Equal(t, 1, handled[id], "message %s handled once", id)
	}
	pending, err := store.PendingAfter(context.Background(), topic, 0, 10)
	require.NoError(t, err)
	assert.Empty(t, pending)
}
