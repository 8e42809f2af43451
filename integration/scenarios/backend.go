package scenarios

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/internal/testenv"
)

// Backend is one Watermill pub/sub the scenarios run against, with the
// database that holds the outbox records.
type Backend struct {
	// Name names the pub/sub in test output.
	Name string

	// Records is the database the outbox records are kept in.
	Records testenv.Backend

	// Connect returns a publisher and a subscriber on connections of their
	// own, as one process of a service opens them. Subscribers built for the
	// same group share the consumer group (Kafka, Redis, SQL), durable
	// consumer (NATS) or queue (AMQP), as the instances of one service do,
	// so a second Connect is a restarted process. Connect closes both when
	// the test ends; closing them earlier must be harmless.
	Connect func(t *testing.T, group string) (message.Publisher, message.Subscriber)

	// Volatile tells that the broker keeps nothing for a subscriber that
	// is closed (GoChannel): what is published to its topic meanwhile is
	// lost, and only a resend brings it back.
	Volatile bool

	// FanOut tells that subscribers of one group each receive every
	// message (GoChannel has no groups): two instances of one service
	// cannot share its messages.
	FanOut bool

	// Remove deletes what the pub/sub created on the broker for a topic and
	// group (queues, exchanges, streams, tables). It runs when the test
	// ends, after the publishers and subscribers are closed. Nil when the
	// broker keeps nothing beyond the test.
	Remove func(t *testing.T, topic, group string)
}
