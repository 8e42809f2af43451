package outboxtest

import (
	"context"
	"fmt"
	"slices"
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
	// Tracked is true when the message carried outbox metadata and the
	// outbox checked its record for the handler, as it does in
	// production; false when the handler ran untracked, touching no
	// record (Deliver then fails the test), or the message carried no
	// outbox metadata.
	Tracked bool
	// Runs is how many times the handler ran: 0 when the outbox did not
	// run it (a copy of a record the handler already completed, or a
	// record that is not due or leased), 1 otherwise.
	Runs int
	// Err is what the router's handler returned: the handler's error (a
	// panic is recovered into one), or the outbox's, such as an
	// [*outbox.CheckError] or an [*outbox.AbandonedError]; nil when the
	// message was acknowledged, and for a copy that the outbox held until
	// its next attempt was due and nacked itself (Acked false, Runs 0).
	Err error
	// Produced are the messages the handler returned, as the router
	// published them through the outbox's publisher decorator (tracked
	// ones carry their record's metadata), for [DeliverProducing]; nil
	// for Deliver. They are copies with a background context, as
	// [Publisher.Sent] returns, usable after the router has closed.
	Produced []*message.Message
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
// and returns the outcome once the router has acknowledged or nacked it.
// The middleware sees the handler name and the subscribed topic as in
// production, so several handlers of one topic, declared consumers and
// one-receiver conflicts behave as they do there. A message that carries
// no outbox metadata runs the handler untracked. What the router and the
// middleware log at Error goes to the test's log (tb.Logf).
//
// A message with outbox metadata that the outbox lets through untracked
// (a handlerName that is not one of the topic's declared consumers, say)
// fails the test with the fix: in production its record would stay
// pending.
//
// DeliverWith hands the message once and never redelivers it: call it
// again to deliver a copy. It fails the test if reg does not track (build
// it with [NewRegistry]), if cfg is invalid, or if the router has not
// settled the message within 30 seconds.
func DeliverWith(tb testing.TB, reg *outbox.Registry, cfg outbox.MiddlewareConfig, handlerName, topic string, handler message.NoPublishHandlerFunc, msg *message.Message) Outcome {
	tb.Helper()
	return deliver(tb, reg, cfg, handlerName, topic, "", func(m *message.Message) ([]*message.Message, error) {
		return nil, handler(m)
	}, msg)
}

// DeliverProducing is [Deliver] for a handler that returns messages: the
// router publishes them to publishTopic through the outbox's publisher
// decorator ([outbox.PublisherDecorator]), so that a tracked publishTopic
// gets a record of each in its store, and the delivery completes only
// once they are published, as in production. Outcome.Produced has them.
func DeliverProducing(tb testing.TB, reg *outbox.Registry, handlerName, topic, publishTopic string, handler message.HandlerFunc, msg *message.Message) Outcome {
	tb.Helper()
	if publishTopic == "" {
		tb.Fatalf("outboxtest: DeliverProducing needs the topic the handler's messages are published to")
	}
	return deliver(tb, reg, outbox.MiddlewareConfig{}, handlerName, topic, publishTopic, handler, msg)
}

func deliver(tb testing.TB, reg *outbox.Registry, cfg outbox.MiddlewareConfig, handlerName, topic, publishTopic string, handler message.HandlerFunc, msg *message.Message) Outcome {
	tb.Helper()
	if !reg.Enabled() {
		tb.Fatalf("outboxtest: the registry tracks nothing in this test binary; build it with outboxtest.NewRegistry, or set %s=on before outbox.NewRegistry", outbox.EnvToggle)
	}
	var mu sync.Mutex
	var out Outcome
	untracked := false
	onUntracked := cfg.OnUntracked
	cfg.OnUntracked = func(m *message.Message) {
		mu.Lock()
		untracked = true
		mu.Unlock()
		if onUntracked != nil {
			onUntracked(m)
		}
	}
	logger := testLogger{tb: tb}
	mw, err := outbox.NewMiddleware(reg, cfg, logger)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: deliverTimeout}, logger)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}

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
	run := func(m *message.Message) ([]*message.Message, error) {
		mu.Lock()
		out.Runs++
		mu.Unlock()
		return handler(m)
	}
	sub := &once{msg: copied}
	sent := &sentMessages{byTopic: map[string][]*message.Message{}}
	if publishTopic == "" {
		router.AddNoPublisherHandler(handlerName, topic, sub, func(m *message.Message) error {
			_, err := run(m)
			return err
		})
	} else {
		router.AddPublisherDecorators(outbox.PublisherDecorator(reg))
		router.AddHandler(handlerName, topic, sub, publishTopic, sent, run)
	}

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
	// The completion of an acknowledged delivery runs in the background;
	// the outcome is its record's state once it has.
	if err := reg.WaitCompletions(ctx); err != nil {
		tb.Fatalf("outboxtest: the completion of message %s did not finish within %v: %v", msg.UUID, deliverTimeout, err)
	}
	mu.Lock()
	defer mu.Unlock()
	out.Acked = acked
	out.Tracked = msg.Metadata.Get(outbox.MetadataID) != "" && !untracked
	if publishTopic != "" {
		out.Produced = sent.byTopic[publishTopic]
	}
	if untracked {
		tb.Errorf("outboxtest: handler %q ran untracked on message %s of tracked topic %q: its record stays pending. %s",
			handlerName, msg.UUID, topic, untrackedFix(reg, handlerName, topic))
	}
	return out
}

// untrackedFix names the fix of an untracked delivery, for a failure
// message.
func untrackedFix(reg *outbox.Registry, handlerName, topic string) string {
	consumers := reg.Consumers(topic)
	if len(consumers) > 0 && !slices.Contains(consumers, handlerName) {
		return fmt.Sprintf("%q is not one of the topic's declared consumers %q: pass the handler's name as the service registers it, or add it to Tracked.Consumers", handlerName, consumers)
	}
	if len(consumers) == 0 && len(reg.RemoteConsumers(topic)) == 0 {
		return "The topic declares no consumers and another handler received it: declare both in Tracked.Consumers (or the log above says otherwise)"
	}
	return "The log above says why"
}

// testLogger writes the router's and the middleware's Error lines to the
// test's log: the lines that say why a delivery went wrong.
type testLogger struct{ tb testing.TB }

func (l testLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.tb.Logf("outboxtest: ERROR %s: %v %v", msg, err, fields)
}

func (l testLogger) Info(string, watermill.LogFields) {}

func (l testLogger) Debug(string, watermill.LogFields) {}

func (l testLogger) Trace(string, watermill.LogFields) {}

func (l testLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

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
