package integration_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/wmoutbox/outbox/integration/scenarios"
	"github.com/wmoutbox/outbox/internal/testenv"
)

func TestNATSJetStream(t *testing.T) {
	t.Parallel()
	url := env("OUTBOX_TEST_NATS_URL", "nats://127.0.0.1:4222")
	admin, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		testenv.Unavailable(t, "NATS", err)
	}
	t.Cleanup(admin.Close)
	js, err := admin.JetStream()
	if err != nil {
		testenv.Unavailable(t, "NATS JetStream", err)
	}

	scenarios.Run(t, scenarios.Backend{
		Name:    "NATS JetStream",
		Records: records(t, "SQLite"),
		Connect: func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			jsConfig := natsJetStreamConfig(group)
			pub, err := wnats.NewPublisher(wnats.PublisherConfig{
				URL:       url,
				Marshaler: &wnats.NATSMarshaler{},
				JetStream: jsConfig,
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatalf("nats publisher: %v", err)
			}
			closed := make(chan struct{})
			conn, err := nats.Connect(url, nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
			if err != nil {
				t.Fatalf("nats connection: %v", err)
			}
			sub, err := wnats.NewSubscriberWithNatsConn(conn, wnats.SubscriberSubscriptionConfig{
				QueueGroupPrefix: group,
				Unmarshaler:      &wnats.NATSMarshaler{},
				AckWaitTimeout:   30 * time.Second,
				CloseTimeout:     5 * time.Second,
				JetStream:        jsConfig,
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatalf("nats subscriber: %v", err)
			}
			return connected(t, pub, &settledSubscriber{inner: sub, conn: conn, connClosed: closed, closing: make(chan struct{})})
		},
		Remove: func(t *testing.T, topic, _ string) {
			// The stream is named after the topic; its consumers go with it.
			if err := js.DeleteStream(topic); err != nil && err != nats.ErrStreamNotFound {
				t.Logf("delete stream %s: %v", topic, err)
			}
		},
	})
}

// natsJetStreamConfig provisions a stream per topic on first use and a
// durable consumer per topic and group that starts at the first message of
// the stream, so a consumer created at startup still gets what replay sent.
func natsJetStreamConfig(group string) wnats.JetStreamConfig {
	return wnats.JetStreamConfig{
		AutoProvision:    true,
		SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit()},
		DurablePrefix:    group,
		DurableCalculator: func(prefix, topic string) string {
			return prefix + "_" + topic
		},
	}
}

// settledSubscriber works around a race in watermill-nats v2.1.3 (the
// newest): its subscriber closes its output channel once the subscription's
// context ends, or once it is closed, without waiting for a NATS callback
// that is sending on it, which the race detector reports (and which can
// panic). The inner subscription runs on a context that never ends, and the
// inner subscriber is never closed, so its channels never are: the router
// reads the wrapper's own channel, which ends with the router's context.
// Close closes the NATS connection instead, nacking what its callbacks
// still send until it has closed; the inner subscriber's goroutines that
// wait for its close stay until the test binary exits.
type settledSubscriber struct {
	inner      message.Subscriber
	conn       *nats.Conn
	connClosed chan struct{}
	closing    chan struct{}
	once       sync.Once
	wg         sync.WaitGroup
}

func (s *settledSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.inner.Subscribe(context.Background(), topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.forward(ctx, in, out)
		close(out)
		// What arrives once the router stopped stays unacked, for the
		// next subscriber, until this one closes; then what the closing
		// connection's callbacks still send is nacked, until it has
		// closed.
		<-s.closing
		for {
			select {
			case m := <-in:
				m.Nack()
			case <-s.connClosed:
				return
			}
		}
	}()
	return out, nil
}

// forward hands the inner subscription's messages to the router until its
// context ends or the subscriber closes.
func (s *settledSubscriber) forward(ctx context.Context, in <-chan *message.Message, out chan<- *message.Message) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		case m := <-in:
			select {
			case out <- m:
			case <-ctx.Done():
				m.Nack()
				return
			case <-s.closing:
				m.Nack()
				return
			}
		}
	}
}

func (s *settledSubscriber) Close() error {
	s.once.Do(func() {
		close(s.closing)
		s.conn.Close()
	})
	<-s.connClosed
	s.wg.Wait()
	return nil
}
