package loop_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/loop"
)

const guard = 20 * time.Second

// TestEveryRunsRoundsAndLogsFailuresUntilCancelled: a failed round is
// logged and the next one runs; cancelling the context ends the loop with
// nil.
func TestEveryRunsRoundsAndLogsFailuresUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	logger := watermill.NewCaptureLogger()
	rounds := make(chan int, 10)
	n := 0
	done := make(chan error, 1)
	go func() {
		done <- loop.Every(ctx, time.Millisecond, logger, "round failed", func(context.Context) error {
			n++
			rounds <- n
			if n == 1 {
				return errors.New("boom")
			}
			return nil
		})
	}()
	for want := 1; want <= 3; want++ {
		select {
		case got := <-rounds:
			assert.Equal(t, want, got)
		case <-time.After(guard):
			t.Fatal("no round")
		}
	}
	cancel()
	require.NoError(t, <-done)
	logged := logger.Captured()[watermill.ErrorLogLevel]
	require.Len(t, logged, 1, "the failed round was logged, once")
	assert.Equal(t, "round failed", logged[0].Msg)
	assert.EqualError(t, logged[0].Err, "boom")
}

// TestWithRouterRunsWhileTheRouterRuns: the loop starts once the router
// runs, on a context the router cancels as it closes, and the counter the
// plugin was given sees it start and end; a router without handlers gets
// the given error.
func TestWithRouterRunsWhileTheRouterRuns(t *testing.T) {
	noHandlers := errors.New("no handlers")
	started, ended := make(chan struct{}), make(chan struct{})
	var stoppingAtEnd bool
	var stopping func() bool
	start := func(s func() bool) func() {
		stopping = s
		close(started)
		return func() { stoppingAtEnd = stopping(); close(ended) }
	}
	ran := make(chan struct{})
	plugin := loop.WithRouter(start, noHandlers, func(ctx context.Context) error {
		close(ran)
		<-ctx.Done()
		return nil
	})

	empty, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	assert.ErrorIs(t, plugin(empty), noHandlers)

	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer gc.Close()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddNoPublisherHandler("h", "t", gc, func(*message.Message) error { return nil })
	router.AddPlugin(plugin)
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	for _, c := range []chan struct{}{started, ran} {
		select {
		case <-c:
		case <-time.After(guard):
			t.Fatal("the loop did not start with the router")
		}
	}
	assert.False(t, stopping(), "the router runs")
	require.NoError(t, router.Close())
	require.NoError(t, <-runErr)
	select {
	case <-ended:
	case <-time.After(guard):
		t.Fatal("the loop did not end when the router closed")
	}
	assert.True(t, stoppingAtEnd, "stopping reports the closing router")
}
