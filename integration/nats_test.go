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
			sub, err := wnats.NewSubscriber(wnats.SubscriberConfig{
				URL:              url,
				QueueGroupPrefix: group,
				Unmarshaler:      &wnats.NATSMarshaler{},
				AckWaitTimeout:   30 * time.Second,
				CloseTimeout:     5 * time.Second,
				JetStream:        jsConfig,
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatalf("nats subscriber: %v", err)
			}
			return connected(t, pub, &settledSubscriber{inner: sub, closing: make(chan struct{})})
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
// context ends, without waiting for a NATS callback that is sending on it,
// which the race detector reports (and which can panic). The inner
// subscription runs on a context that never ends; the router reads the
// wrapper's own channel, which ends with the router's context; while Close
// closes the inner subscriber the forwarders read what its callbacks still
// send, so that none is left blocked sending on a channel being closed.
type settledSubscriber struct {
	inner   message.Subscriber
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
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
		defer s.nackUntilClosed(in)
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			case m, ok := <-in:
				if !ok {
					return
				}
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
	}()
	return out, nil
}

// nackUntilClosed leaves what arrives once the router stopped unacked,
// for the next subscriber, until this one closes; then it nacks what the
// inner subscription's callbacks still send until the inner subscriber
// closes its channel, so that no callback is left sending on a channel
// being closed.
func (s *settledSubscriber) nackUntilClosed(in <-chan *message.Message) {
	<-s.closing
	for m := range in {
		m.Nack()
	}
}

func (s *settledSubscriber) Close() error {
	s.once.Do(func() { close(s.closing) })
	err := s.inner.Close()
	s.wg.Wait()
	return err
}
