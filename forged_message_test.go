package outbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestForgedMessageNamingAPendingRecordIsNotHandled (issue 21, item 3):
// one service, one router on GoChannel, one handler. A tracked message
// whose send failed leaves its record pending; a message with another UUID
// and payload that carries the record's outbox metadata (id, topic and
// the store identity, which every message carries) arrives first, and
// another without a UUID. Each forged message is acknowledged without running the handler, counted and
// logged as a mismatch, and the record stays pending until the replay
// brings the real message, which is handled once and completes it.
func TestForgedMessageNamingAPendingRecordIsNotHandled(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		obs := newSignals()
		b.reg.SetObserver(obs)
		gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		t.Cleanup(func() { _ = gc.Close() })

		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		router.AddMiddleware(b.middleware(t))
		var mu sync.Mutex
		var handled []string // the payloads the handler ran on
		router.AddNoPublisherHandler("consume", b.topic, gc, func(msg *message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			handled = append(handled, string(msg.Payload))
			return nil
		})
		runErr := make(chan error, 1)
		go func() { runErr <- router.Run(context.Background()) }()
		<-router.Running()

		// The real message's send fails: its record stays pending.
		pub, err := outbox.NewPublisher(b.reg, failingPublisher{})
		require.NoError(t, err)
		sent := message.NewMessage(watermill.NewUUID(), []byte("real"))
		require.Error(t, pub.Publish(b.topic, sent))
		id := idOf(t, sent)
		require.Equal(t, 1, b.pendingCount(t))

		// Forged with another UUID, and with none (which must not pass
		// for "any message").
		forged := message.NewMessage(watermill.NewUUID(), []byte("forged"))
		for _, msg := range []*message.Message{forged, message.NewMessage("", []byte("forged without a UUID"))} {
			for _, k := range []string{outbox.MetadataID, outbox.MetadataTopic, outbox.MetadataTable} {
				msg.Metadata.Set(k, sent.Metadata.Get(k))
			}
			require.NoError(t, gc.Publish(b.topic, msg))
			select {
			case <-obs.mismatched:
			case <-obs.handled:
				t.Fatalf("the forged message %q was handled as the record's and completed it", msg.UUID)
			case <-b.ctx(t).Done():
				t.Fatalf("the forged message %q was never reported as a mismatch", msg.UUID)
			}
		}
		assert.Equal(t, 1, b.pendingCount(t), "the forged message left the record pending")
		logged := false
		for _, e := range b.logger.Entries("error") {
			if e.Fields["message_uuid"] == forged.UUID {
				logged = true
				assert.Equal(t, b.topic, e.Fields["topic"])
				assert.Equal(t, id, e.Fields["outbox_id"])
				assert.Equal(t, "consume", e.Fields["consumer"])
			}
		}
		assert.True(t, logged, "the mismatch is logged at error level with the forged message's UUID")

		res, err := outbox.Replay(b.ctx(t), b.reg, gc, outbox.ReplayConfig{}, b.logger)
		require.NoError(t, err)
		require.Equal(t, 1, res.Total())
		select {
		case <-obs.handled:
		case <-b.ctx(t).Done():
			t.Fatal("the replayed real message was never handled")
		}
		require.NoError(t, router.Close())
		require.NoError(t, <-runErr)

		mu.Lock()
		assert.Equal(t, []string{"real"}, handled, "the handler ran once, on the real message only")
		mu.Unlock()
		assert.Zero(t, b.pendingCount(t), "the real message completed the record")
		assert.Equal(t, 2, obs.get("mismatched"))
		assert.Equal(t, 1, obs.get("handled"))
	})
}

// signals is an Observer that counts reports and signals the mismatches
// and the completions.
type signals struct {
	*tally
	mismatched, handled chan struct{}
}

func newSignals() *signals {
	return &signals{tally: newTally(), mismatched: make(chan struct{}, 16), handled: make(chan struct{}, 16)}
}

func (s *signals) Completed(name, consumer string) {
	s.tally.Completed(name, consumer)
	s.handled <- struct{}{}
}

func (s *signals) Mismatched(string, string) {
	s.add("mismatched", 1)
	s.mismatched <- struct{}{}
}
