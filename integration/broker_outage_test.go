package integration_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/faultproxy"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestBrokerOutage cuts the TCP connection to RabbitMQ with a real proxy:
// tracked publishes return the broker's error and leave their records
// pending; after the broker is back, the next start replays them all.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	admin, err := amqp091.Dial(amqpURI())
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	defer admin.Close()
	backend := records(t, "Postgres")
	db := backend.Open(t)
	store := testenv.NewStore(t, backend, db, sqlstore.Mark)
	topic := "outage_" + store.Table()
	reg, err := outbox.NewRegistry(outbox.Tracked{Name: topic, Store: store})
	require.NoError(t, err)

	u, err := url.Parse(amqpURI())
	require.NoError(t, err)
	proxy, err := faultproxy.New(u.Host)
	require.NoError(t, err)
	defer proxy.Close()
	u.Host = proxy.Addr()
	config := func(uri string) amqp.Config {
		return amqp.NewDurablePubSubConfig(uri, amqp.GenerateQueueNameTopicNameWithSuffix("outage"))
	}
	t.Cleanup(func() {
		ch, err := admin.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		_, _ = ch.QueueDelete(config(amqpURI()).Queue.GenerateName(topic), false, false, false)
		_ = ch.ExchangeDelete(config(amqpURI()).Exchange.GenerateName(topic), false, false)
	})

	rawViaProxy, err := amqp.NewPublisher(config(u.String()), watermill.NopLogger{})
	require.NoError(t, err)
	defer rawViaProxy.Close()
	pub, err := outbox.NewPublisher(rawViaProxy, reg)
	require.NoError(t, err)

	proxy.Cut()
	var uuids []string
	for i := 0; i < 3; i++ {
		msg := message.NewMessage(fmt.Sprintf("during-outage-%d", i), []byte("x"))
		err := pub.Publish(topic, msg)
		var sendErr *outbox.SendError
		require.ErrorAs(t, err, &sendErr, "the broker's error reaches the caller")
		require.Len(t, sendErr.IDs, 1)
		require.NoError(t, store.CheckPending(context.Background(), sendErr.IDs[0]), "its record stays pending")
		uuids = append(uuids, msg.UUID)
	}
	// The proxy stays cut: the publisher behind it keeps retrying in the
	// background, and watermill-amqp's Close races with a reconnect that
	// succeeds (it writes the connection without the lock Close would
	// need). The restarted service below reaches the broker directly.

	// The next start, with the broker back, replays what the outage kept.
	rawPub, err := amqp.NewPublisher(config(amqpURI()), watermill.NopLogger{})
	require.NoError(t, err)
	defer rawPub.Close()
	sub, err := amqp.NewSubscriber(config(amqpURI()), watermill.NopLogger{})
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
