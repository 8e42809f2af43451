package integration_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestNotOwnedCountsEveryUntrackedMessage checks the Observer's contract
// for a handler that is not the topic's consumer: NotOwned "counts messages
// [...] a handler that is not a consumer of the record. Their handler runs
// untracked." Every message such a handler runs untracked is one count, as
// it is for another service's messages, so that the metric shows how much
// runs untracked, not only that something did.
func TestNotOwnedCountsEveryUntrackedMessage(t *testing.T) {
	t.Parallel()
	const n = 5
	for _, tc := range []struct {
		name      string
		consumers []string // declared
		handlers  []string
		untracked string
	}{
		{"SecondHandlerOfUndeclaredTopic", nil, []string{"email", "stats"}, ""},
		{"HandlerNotDeclared", []string{"email"}, []string{"email", "audit"}, "audit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := records(t, "SQLite")
			db := b.Open(t)
			store := testenv.NewStore(t, b, db, sqlstore.Mark)
			topic := "orders_" + store.Table()
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store, Consumers: tc.consumers})
			require.NoError(t, err)
			obs := &notOwnedCounter{n: map[string]int{}}
			reg.SetObserver(obs)

			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
			require.NoError(t, err)
			router.AddMiddleware(mw)
			var mu sync.Mutex
			runs := map[string]int{}
			tracked := map[string]int{}
			all := make(chan struct{})
			for _, h := range tc.handlers {
				router.AddNoPublisherHandler(h, topic, gc, func(msg *message.Message) error {
					mu.Lock()
					defer mu.Unlock()
					runs[h]++
					if _, ok := outbox.RecordFromContext(msg.Context()); ok {
						tracked[h]++
					}
					if total(runs) == n*len(tc.handlers) {
						close(all)
					}
					return nil
				})
			}
			runErr := make(chan error, 1)
			go func() { runErr <- router.Run(context.Background()) }()
			<-router.Running()

			pub, err := outbox.NewPublisher(reg, gc)
			require.NoError(t, err)
			for i := range n {
				require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("m-%d", i), []byte("{}"))))
			}
			select {
			case <-all:
			case <-time.After(30 * time.Second):
				t.Fatalf("handler runs: %v", runs)
			}
			require.NoError(t, router.Close())
			require.NoError(t, <-runErr)

			untracked := tc.untracked
			if untracked == "" {
				// The second handler to receive the topic.
				for _, h := range tc.handlers {
					if tracked[h] == 0 {
						untracked = h
					}
				}
			}
			require.Equal(t, n, runs[untracked])
			require.Zero(t, tracked[untracked])
			assert.Equal(t, n, obs.get(untracked), "NotOwned reports for the %d messages %s ran untracked", n, untracked)
		})
	}
}

func total(m map[string]int) int {
	s := 0
	for _, v := range m {
		s += v
	}
	return s
}

// notOwnedCounter counts NotOwned reports per consumer.
type notOwnedCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *notOwnedCounter) get(consumer string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[consumer]
}

func (c *notOwnedCounter) NotOwned(_, consumer string) {
	c.mu.Lock()
	c.n[consumer]++
	c.mu.Unlock()
}

func (c *notOwnedCounter) Published(string, int)                  {}
func (c *notOwnedCounter) Completed(string, string)               {}
func (c *notOwnedCounter) DuplicateSkipped(string, string)        {}
func (c *notOwnedCounter) Failed(string, string)                  {}
func (c *notOwnedCounter) Abandoned(string, string)               {}
func (c *notOwnedCounter) Resent(string, observe.ResendKind, int) {}
func (c *notOwnedCounter) UnknownRecord(string, string)           {}
func (c *notOwnedCounter) Mismatched(string, string)              {}
