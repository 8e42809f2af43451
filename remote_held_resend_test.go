package outbox_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
)

// laterFirst is a broker's publisher that sends the message first of a
// publish after the others, once the receiver held one of them: the
// broker brought a key's second message before its first.
type laterFirst struct {
	message.Publisher
	first string
	held  func() bool
}

func (p laterFirst) Publish(topic string, msgs ...*message.Message) error {
	var rest []*message.Message
	var first *message.Message
	for _, m := range msgs {
		if m.UUID == p.first {
			first = m
		} else {
			rest = append(rest, m)
		}
	}
	if err := p.Publisher.Publish(topic, rest...); err != nil || first == nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); !p.held() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return p.Publisher.Publish(topic, first)
}

// TestHeldMessageSentAgainOnceItsPredecessorIsConfirmed: B receives k00's
// second message before its first and holds it; A puts it back. Once B
// confirms the first, A sends the second again at once, not when its
// stale resubmitter finds it unconfirmed (ConfirmWithin, 30 s by
// default, which this test leaves as it is).
func TestHeldMessageSentAgainOnceItsPredecessorIsConfirmed(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := startOrderedServices(t, testenv.Backends()[0], outbox.Tracked{}, outbox.MiddlewareConfig{}, func(*message.Message) error { return nil },
		withReplay(outbox.ReplayConfig{}))
	a, r, rdb, broker := s.a, s.r, s.rdb, s.broker
	pub, err := outbox.NewPublisher(a.reg, laterFirst{Publisher: broker, first: "k00-000", held: func() bool { return heldLogs(r.logger) > 0 }})
	require.NoError(t, err)
	require.NoError(t, pub.Publish("orders", keyed(0, 0), keyed(0, 1)))
	require.Equal(t, 1, heldLogs(r.logger), "B held k00-001")

	sent := time.Now()
	a.waitDrained(t, ctx, "orders")
	assert.Less(t, time.Since(sent), 5*time.Second, "k00-001 was sent again when k00-000 was confirmed")
	assert.Equal(t, []int{0, 1}, rdb.byKey(t)["k00"])
	s.stop(t)
}

// inTurn is a broker's publisher that sends the messages of a publish one
// at a time, calling wait before each but the first: the later ones wait
// at the broker, as behind a backlog.
type inTurn struct {
	message.Publisher
	wait func()
}

func (p inTurn) Publish(topic string, msgs ...*message.Message) error {
	for i, m := range msgs {
		if i > 0 {
			p.wait()
		}
		if err := p.Publisher.Publish(topic, m); err != nil {
			return err
		}
	}
	return nil
}

// TestNextMessageQueuedAtTheBrokerIsNotSentAgain: k00's second message
// reaches B only after B confirmed the first, which took longer than
// Check.HeldWait: it waited at the broker, as behind a backlog. B holds
// nothing, and A, confirmed the first, does not send the second again:
// it was not held, and its copy is on its way.
func TestNextMessageQueuedAtTheBrokerIsNotSentAgain(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := startOrderedServices(t, testenv.Backends()[0], outbox.Tracked{}, outbox.MiddlewareConfig{}, func(*message.Message) error {
		time.Sleep(400 * time.Millisecond) // above Check.HeldWait
		return nil
	}, withReplay(outbox.ReplayConfig{}))
	a, r, rdb, broker := s.a, s.r, s.rdb, s.broker
	pub, err := outbox.NewPublisher(a.reg, inTurn{Publisher: broker, wait: func() {
		a.waitHandled(t, ctx, 1)
		time.Sleep(200 * time.Millisecond) // A's claims after the confirmation
	}})
	require.NoError(t, err)
	require.NoError(t, pub.Publish("orders", keyed(0, 0), keyed(0, 1)))
	a.waitDrained(t, ctx, "orders")
	assert.Equal(t, 0, heldLogs(r.logger))
	assert.Equal(t, 0, a.obs.get("replayed"), "nothing sent again")
	assert.Equal(t, []int{0, 1}, rdb.byKey(t)["k00"])
	s.stop(t)
}
