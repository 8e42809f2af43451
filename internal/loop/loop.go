// Package loop runs the outbox's background loops: a round every interval,
// and a router plugin that runs a loop while its router runs.
package loop

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Every runs round every interval until ctx is done, then returns nil. A
// failed round is logged with failure and does not stop the loop.
func Every(ctx context.Context, interval time.Duration, logger watermill.LoggerAdapter, failure string, round func(context.Context) error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := round(ctx); err != nil && ctx.Err() == nil {
			logger.Error(failure, err, nil)
		}
	}
}

// WithRouter returns a router plugin that runs run, from the moment the
// router is running, on the context the router gives its subscriptions: the
// router cancels it when it starts closing, which stops run. start counts
// the loop until the function it returns is called, once run returned;
// stopping, which it is given, reports whether the router closes or has
// closed. A router without handlers has no subscription to give a context:
// the plugin returns noHandlers.
func WithRouter(start func(stopping func() bool) (end func()), noHandlers error, run func(ctx context.Context) error) message.RouterPlugin {
	return func(router *message.Router) error {
		return OnSubscribe(noHandlers, func(ctx context.Context) {
			end := start(func() bool { return ctx.Err() != nil || router.IsClosed() })
			go func() {
				defer end()
				select {
				case <-router.Running():
				case <-ctx.Done():
					return
				}
				_ = run(ctx)
			}()
		})(router)
	}
}

// OnSubscribe returns a router plugin that calls hold once, with the
// context the router gives its subscriptions, at the first Subscribe:
// before any handler receives a message. The router cancels the context
// when it starts closing, or when its start fails. A router without
// handlers never subscribes: the plugin returns noHandlers.
func OnSubscribe(noHandlers error, hold func(ctx context.Context)) message.RouterPlugin {
	return func(router *message.Router) error {
		if len(router.Handlers()) == 0 {
			return noHandlers
		}
		var once sync.Once
		router.AddSubscriberDecorators(func(sub message.Subscriber) (message.Subscriber, error) {
			return &contextTap{Subscriber: sub, tap: func(ctx context.Context) {
				once.Do(func() { hold(ctx) })
			}}, nil
		})
		return nil
	}
}

// contextTap hands the context of the first Subscribe call to tap.
type contextTap struct {
	message.Subscriber
	tap func(ctx context.Context)
}

func (s *contextTap) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.tap(ctx)
	return s.Subscriber.Subscribe(ctx, topic)
}
