package outboxtest

import (
	"bytes"
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

// Sent returns the messages sent to the topic, in order, as they were when
// they were sent. Tracked messages carry the outbox metadata that the
// middleware reads.
//
// Each call returns new copies, with the UUID, metadata and payload sent
// and a background context, as a broker delivers them: a message published
// from a router's handler (a receiver's confirmation, say) is usable after
// that router has closed, and a test that changes a copy changes nothing
// that the publisher keeps.
func (p *Publisher) Sent(topic string) []*message.Message {
	p.sent.mu.Lock()
	defer p.sent.mu.Unlock()
	kept := p.sent.byTopic[topic]
	out := make([]*message.Message, len(kept))
	for i, msg := range kept {
		out[i] = copyMessage(msg)
	}
	return out
}

// copyMessage returns a copy of msg that shares nothing with it, with a
// background context. message.Copy shares the payload's bytes.
func copyMessage(msg *message.Message) *message.Message {
	c := message.NewMessage(msg.UUID, bytes.Clone(msg.Payload))
	for k, v := range msg.Metadata {
		c.Metadata.Set(k, v)
	}
	return c
}

// sentMessages is the broker under a Publisher: it keeps what it is sent.
type sentMessages struct {
	mu      sync.Mutex
	byTopic map[string][]*message.Message
}

// Publish keeps a copy of each message as it is sent: the code under test
// may change or reuse a message once Publish has returned.
func (s *sentMessages) Publish(topic string, msgs ...*message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, msg := range msgs {
		s.byTopic[topic] = append(s.byTopic[topic], copyMessage(msg))
	}
	return nil
}

func (s *sentMessages) Close() error { return nil }
