package outboxtest

import (
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
)

// Publisher is the outbox publisher of a test: the code under test
// publishes through it as through [outbox.NewPublisher], which saves a
// record of each tracked message in its store, and instead of a broker it
// keeps the messages it sent, with their outbox metadata, for [Deliver].
// It is safe for concurrent use.
type Publisher struct {
	message.Publisher
	sent *sentMessages
}

// NewPublisher returns the outbox publisher of reg over an in-memory
// broker that keeps what it is sent. It fails the test if reg is nil.
func NewPublisher(tb testing.TB, reg *outbox.Registry) *Publisher {
	tb.Helper()
	sent := &sentMessages{byTopic: map[string][]*message.Message{}}
	pub, err := outbox.NewPublisher(reg, sent)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	return &Publisher{Publisher: pub, sent: sent}
}

// Sent returns the messages sent to the topic, in order. Tracked messages
// carry the outbox metadata that the middleware reads.
func (p *Publisher) Sent(topic string) []*message.Message {
	p.sent.mu.Lock()
	defer p.sent.mu.Unlock()
	return append([]*message.Message(nil), p.sent.byTopic[topic]...)
}

// sentMessages is the broker under a Publisher: it keeps what it is sent.
type sentMessages struct {
	mu      sync.Mutex
	byTopic map[string][]*message.Message
}

func (s *sentMessages) Publish(topic string, msgs ...*message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byTopic[topic] = append(s.byTopic[topic], msgs...)
	return nil
}

func (s *sentMessages) Close() error { return nil }
