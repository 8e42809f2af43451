package outboxtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmoutbox/outbox"
)

// deliverTimeout bounds one Deliver.
const deliverTimeout = 30 * time.Second

// Outcome is what became of a message handed to [Deliver].
type Outcome struct {
	// Acked is true when the router acknowledged the message, false when
	// it nacked it (the broker would redeliver it).
	Acked bool
	// Runs is how many times the handler ran: 0 when the outbox did not
	// run it (a copy of a record the handler already completed, or a
	// record that is not due or leased), 1 otherwise.
	Runs int
	// Err is what the router's handler returned: the handler's error (a
	// panic is recovered into one), or the outbox's, such as an
	// [*outbox.FetchError] or an [*outbox.AbandonedError]; nil when the
	// message was acknowledged, and for a copy that the outbox held until
	// its next attempt was due and nacked itself (Acked false, Runs 0).
	Err error
}

// Deliver is [DeliverWith] with [outbox.MiddlewareConfig]'s defaults.
func Deliver(tb testing.TB, reg *outbox.Registry, handlerName, topic string, handler message.NoPublishHandlerFunc, msg *message.Message) Outcome {
	tb.Helper()
	return DeliverWith(tb, reg, outbox.MiddlewareConfig{}, handlerName, topic, handler, msg)
}

// DeliverWith hands one copy of msg to handler, as the Watermill handler
// handlerName subscribed to topic, through a real [message.Router] with
// the outbox middleware of reg configured by cfg (MaxAttempts and
// OnAbandon, say, as the service sets them) and, outside it, a Recoverer,
// and returns the outcome once the router has acknowledged or nacked it. The middleware sees the handler
// name and the subscribed topic as in production, so several handlers of
// one topic, declared consumers and one-receiver conflicts behave as they
// do there. A message that carries no outbox metadata runs the handler
// untracked.
//
// DeliverWith hands the message once and never redelivers it: call it
// again to deliver a copy. It fails the test if reg does not track (build
// it with [NewRegistry]), if cfg is invalid, or if the router has not
// settled the message within 30 seconds.
func DeliverWith(tb testing.TB, reg *outbox.Registry, cfg outbox.MiddlewareConfig, handlerName, topic string, handler message.NoPublishHandlerFunc, msg *message.Message) Outcome {
	tb.Helper()
	if !reg.Enabled() {
		tb.Fatalf("outboxtest: the registry tracks nothing in this test binary; build it with outboxtest.NewRegistry, or set %s=on before outbox.NewRegistry", outbox.EnvToggle)
	}
	mw, err := outbox.NewMiddleware(reg, cfg, nil)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: deliverTimeout}, watermill.NopLogger{})
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}

	var mu sync.Mutex
	var out Outcome
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			produced, err := h(m)
			mu.Lock()
			out.Err = err
			mu.Unlock()
			return produced, err
		}
	}, middleware.Recoverer, mw)
	copied := msg.Copy()
	router.AddNoPublisherHandler(handlerName, topic, &once{msg: copied}, func(m *message.Message) error {
		mu.Lock()
		out.Runs++
		mu.Unlock()
		return handler(m)
	})

	ctx, cancel := context.WithTimeout(context.Background(), deliverTimeout)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	var acked bool
	select {
	case <-copied.Acked():
		acked = true
	case <-copied.Nacked():
	case err := <-runErr:
		tb.Fatalf("outboxtest: the router stopped before the message was handled: %v", err)
	case <-ctx.Done():
		tb.Fatalf("outboxtest: message %s was neither acked nor nacked within %v", msg.UUID, deliverTimeout)
	}
	if err := router.Close(); err != nil {
		tb.Errorf("outboxtest: closing the router: %v", err)
	}
	if err := <-runErr; err != nil {
		tb.Errorf("outboxtest: running the router: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	out.Acked = acked
	return out
}

// once is a subscriber that delivers one message and nothing more: unlike
// GoChannel, which resends a nacked message at once, it lets Deliver see a
// nack as the outcome.
type once struct{ msg *message.Message }

func (s *once) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	out := make(chan *message.Message, 1)
	s.msg.SetContext(ctx)
	out <- s.msg
	go func() {
		<-ctx.Done()
		close(out)
	}()
	return out, nil
}

func (s *once) Close() error { return nil }
