package outbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// queueSubscriber stands for a subscriber whose subscriptions share one
// queue or consumer group, as an AMQP or Kafka subscriber's do.
type queueSubscriber struct{ gc *gochannel.GoChannel }

func (q *queueSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return q.gc.Subscribe(ctx, topic)
}

func (q *queueSubscriber) Close() error { return nil }

// TestDeclaredConsumersSharingASubscriberAreReported: two declared
// consumers of one tracked topic in one router, subscribed through one
// subscriber value (one queue or group on every broker but GoChannel),
// are reported at start; through subscribers of their own, or through a
// GoChannel, which gives every subscription every message, they are not.
func TestDeclaredConsumersSharingASubscriberAreReported(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[1]
	store := testenv.NewStore(t, b, b.Open(t), sqlstore.Mark)
	// Each case has a GoChannel of its own: the router closes the
	// subscribers of its handlers, so a case whose subscriber is the
	// GoChannel itself would close it under the cases after it.
	for name, subs := range map[string]func(gc *gochannel.GoChannel) [2]message.Subscriber{
		"OneSubscriberForBoth": func(gc *gochannel.GoChannel) [2]message.Subscriber {
			shared := &queueSubscriber{gc: gc}
			return [2]message.Subscriber{shared, shared}
		},
		"ASubscriberEach": func(gc *gochannel.GoChannel) [2]message.Subscriber {
			return [2]message.Subscriber{&queueSubscriber{gc: gc}, &queueSubscriber{gc: gc}}
		},
		"OneGoChannelForBoth": func(gc *gochannel.GoChannel) [2]message.Subscriber { return [2]message.Subscriber{gc, gc} },
	} {
		t.Run(name, func(t *testing.T) {
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			subs := subs(gc)
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders_" + name, Store: store, Consumers: []string{"email", "stats"}})
			require.NoError(t, err)
			logger := &testenv.CaptureLogger{}
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			router.AddPlugin(outbox.ReplayPlugin(reg, gc, outbox.ReplayConfig{}, logger))
			for i, c := range []string{"email", "stats"} {
				router.AddNoPublisherHandler(c, "orders_"+name, subs[i], func(*message.Message) error { return nil })
			}
			runErr := make(chan error, 1)
			go func() { runErr <- router.Run(context.Background()) }()
			select {
			case <-router.Running():
			case err := <-runErr:
				require.NoError(t, err, "the router did not start")
			}
			require.NoError(t, router.Close())
			require.NoError(t, <-runErr)
			var reported []string
			for _, e := range logger.Entries("error") {
				reported = append(reported, e.Msg)
			}
			if name == "OneSubscriberForBoth" {
				assert.Equal(t, []string{"Two declared consumers of a tracked topic subscribe through one subscriber"}, reported)
			} else {
				assert.Empty(t, reported)
			}
		})
	}
}
