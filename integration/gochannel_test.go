package integration_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmoutbox/outbox/integration/scenarios"
)

func TestGoChannel(t *testing.T) {
	t.Parallel()
	// GoChannel lives in the process, so every Connect of one test shares
	// one GoChannel, through handles that close on their own. Like any
	// restart, a new GoChannel would start empty; replay refills it.
	var channels sync.Map // *testing.T -> *gochannel.GoChannel
	scenarios.Run(t, scenarios.Backend{
		Name:     "GoChannel",
		Records:  records(t, "SQLite"),
		Volatile: true,
		FanOut:   true,
		Connect: func(t *testing.T, _ string) (message.Publisher, message.Subscriber) {
			gc, ok := channels.Load(t)
			if !ok {
				gc = gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
				channels.Store(t, gc)
				t.Cleanup(func() { _ = gc.(*gochannel.GoChannel).Close() })
			}
			h := &goChannelHandle{gc: gc.(*gochannel.GoChannel)}
			return h, h
		},
	})
}

var errHandleClosed = errors.New("gochannel handle closed")

// goChannelHandle is one process's view of a shared GoChannel: closing it
// does not close the GoChannel for the others.
type goChannelHandle struct {
	gc     *gochannel.GoChannel
	closed atomic.Bool
}

func (h *goChannelHandle) Publish(topic string, msgs ...*message.Message) error {
	if h.closed.Load() {
		return errHandleClosed
	}
	return h.gc.Publish(topic, msgs...)
}

func (h *goChannelHandle) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if h.closed.Load() {
		return nil, errHandleClosed
	}
	return h.gc.Subscribe(ctx, topic)
}

func (h *goChannelHandle) Close() error {
	h.closed.Store(true)
	return nil
}
