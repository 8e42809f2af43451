package outbox_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWatermillRouterLeavesAGoroutineAfterAFailedRun is the reproducer of
// a Watermill bug (1.5.1), with Watermill alone: a router with one handler
// on a GoChannel, whose Subscribe fails. Run returns the error, and the
// router leaves one goroutine for ever: watchAllHandlersStopped waits for
// the handler that never started (AddHandler counted it in handlersWg,
// only a started handler's end uncounts it). Close then waits out its
// CloseTimeout and fails (the same accounting as ThreeDotsLabs/watermill
// issue 697, Close after a router that never ran), and the goroutine
// stays. The outbox's failed-start tests allow this one goroutine per
// start; when this test fails, Watermill fixed it, and they need not any
// more. Not parallel: the goroutines counted are the process's.
func TestWatermillRouterLeavesAGoroutineAfterAFailedRun(t *testing.T) {
	gc := gochannel.NewGoChannel(gochannel.Config{}, nil)
	defer func() { require.NoError(t, gc.Close()) }()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Millisecond}, nil)
	require.NoError(t, err)
	router.AddConsumerHandler("h", "topic", refusingSubscriber{gc}, func(*message.Message) error { return nil })

	require.Error(t, router.Run(context.Background()))
	me := currentGoroutine()
	assert.Equal(t, 1, watchersCreatedBy(me), "a goroutine of the router's waits for the handler that never started")
	assert.EqualError(t, router.Close(), "router close timeout")
	assert.Equal(t, 1, watchersCreatedBy(me), "and Close does not end it")
}

// currentGoroutine returns the "goroutine N" of the calling goroutine.
func currentGoroutine() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	head, _, _ := strings.Cut(string(buf), " [")
	return head
}

// watchersCreatedBy counts the router's watchers (routerWatcher) that the
// goroutine g created.
func watchersCreatedBy(g string) int {
	n := 0
	for _, stack := range strings.Split(goroutineDump(), "\n\n") {
		if strings.Contains(stack, routerWatcher) && strings.Contains(stack, "created by github.com/ThreeDotsLabs/watermill/message.(*Router).watchAllHandlersStopped in "+g+"\n") {
			n++
		}
	}
	return n
}
