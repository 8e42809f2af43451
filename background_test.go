package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// gatedStore is a real store whose completions wait for gate.
type gatedStore struct {
	*sqlstore.Store
	entered chan int64
	gate    chan struct{}
}

func (g *gatedStore) Complete(ctx context.Context, d recordstore.Delivery) error {
	g.entered <- d.ID
	<-g.gate
	return g.Store.Complete(ctx, d)
}

// TestCompleteInBackground, one handler of one topic: with
// CompleteInBackground a message goes as soon as its handler succeeded,
// while its completion waits; WaitCompletions waits for the completions,
// and then no record is pending. Without the option, and on a topic with
// an order key, the middleware returns only once the completion is done.
func TestCompleteInBackground(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		for _, c := range []struct {
			name       string
			background bool
			orderKey   string
			returns    bool // before the completion ran
		}{
			{"InBackground", true, "", true},
			{"OnTheHandlersPath", false, "", false},
			{"OrderedTopicOnTheHandlersPath", true, "order", false},
		} {
			t.Run(c.name, func(t *testing.T) {
				b := setup(t, backend, sqlstore.Mark)
				store := &gatedStore{Store: b.store, entered: make(chan int64, 8), gate: make(chan struct{})}
				reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store, OrderKey: c.orderKey})
				require.NoError(t, err)
				ctx := b.ctx(t)

				gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 8}, watermill.NopLogger{})
				t.Cleanup(func() { _ = gc.Close() })
				sent, err := gc.Subscribe(ctx, b.topic)
				require.NoError(t, err)
				pub, err := outbox.NewPublisher(reg, gc)
				require.NoError(t, err)
				mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{CompleteInBackground: c.background}, b.logger)
				require.NoError(t, err)
				handled := 0
				h := mw(func(*message.Message) ([]*message.Message, error) { handled++; return nil, nil })

				const n = 3
				for i := 0; i < n; i++ {
					msg := message.NewMessage(watermill.NewUUID(), []byte("payload"))
					msg.Metadata.Set("order", "k")
					require.NoError(t, pub.Publish(b.topic, msg))
					got := <-sent
					got.Ack()
					copy := got.Copy()
					copy.SetContext(context.Background())
					done := make(chan error, 1)
					go func() { _, err := h(copy); done <- err }()
					if c.returns {
						select {
						case err := <-done:
							require.NoError(t, err)
						case <-time.After(guard):
							t.Fatal("the middleware did not return while the completion waited")
						}
						<-store.entered
						continue
					}
					<-store.entered
					select {
					case <-done:
						t.Fatal("the middleware returned before the completion ran")
					default:
					}
					store.gate <- struct{}{}
					require.NoError(t, <-done)
				}
				assert.Equal(t, n, handled)
				if c.returns {
					assert.Equal(t, n, b.pendingCount(t), "the completions still wait")
					cancelled, cancel := context.WithCancel(ctx)
					cancel()
					assert.ErrorIs(t, reg.WaitCompletions(cancelled), context.Canceled, "completions still run")
					close(store.gate)
				}
				require.NoError(t, reg.WaitCompletions(ctx))
				assert.Zero(t, b.pendingCount(t), "every completion is done once WaitCompletions returns")
			})
		}
	})
}
