package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// attemptsOf reads a record's attempts and last error straight from the table.
func (b *bundle) attemptsOf(t *testing.T, id int64) (int, string) {
	t.Helper()
	var row struct {
		Attempts  int     `db:"attempts"`
		LastError *string `db:"last_error"`
	}
	require.NoError(t, b.db.GetContext(b.ctx(t), &row, b.db.Rebind("SELECT attempts, last_error FROM "+b.store.Table()+" WHERE id = ?"), id))
	if row.LastError == nil {
		return row.Attempts, ""
	}
	return row.Attempts, *row.LastError
}

func TestAttempts(t *testing.T) {
	t.Parallel()

	t.Run("FailuresAreCountedThenTheRecordIsAbandoned", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
				b := setup(t, backend, mode)
				msg := b.publishTracked(t, 1)[0]
				id := idOf(t, msg)
				herr := errors.New("downstream refused")
				h := &recordingHandler{err: herr}
				var hooked []*outbox.AbandonedError
				var hookedMsg *message.Message
				mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{MaxAttempts: 2, Backoff: redeliverAtOnce, OnAbandon: func(m *message.Message, aerr *outbox.AbandonedError) {
					hooked, hookedMsg = append(hooked, aerr), m
				}}, b.logger)
				require.NoError(t, err)
				handle := mw(h.handle)

				_, err = handle(msg.Copy())
				require.ErrorIs(t, err, herr)
				assert.False(t, outbox.IsAbandoned(err), "the first failure of two keeps the record")
				require.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(id)))
				attempts, lastErr := b.attemptsOf(t, id)
				assert.Equal(t, 1, attempts)
				assert.Equal(t, herr.Error(), lastErr)

				_, err = handle(msg.Copy())
				require.ErrorIs(t, err, herr, "the abandon error wraps the handler's")
				require.True(t, outbox.IsAbandoned(err))
				var aerr *outbox.AbandonedError
				require.ErrorAs(t, err, &aerr)
				assert.Equal(t, outbox.AbandonedError{Topic: b.topic, ID: id, Attempts: 2, Err: herr}, *aerr)
				require.Len(t, hooked, 1, "the hook runs once, on abandon")
				assert.Same(t, aerr, hooked[0])
				assert.Empty(t, hookedMsg.Metadata.Get(outbox.MetadataID), "an abandoned message leaves without its record id")
				assert.ErrorIs(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), outbox.ErrNotPending)
				assert.Equal(t, 1, b.rowCount(t), "the abandoned record is kept, %s", mode)

				_, err = handle(msg.Copy())
				require.NoError(t, err, "a copy of an abandoned record is acked")
				assert.EqualValues(t, 2, h.runs.Load(), "and not handled")
			}
		})
	})

	t.Run("SuccessLeavesNoAttempts", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{MaxAttempts: 1}, b.logger)
			require.NoError(t, err)
			_, err = mw((&recordingHandler{}).handle)(msg)
			require.NoError(t, err)
			attempts, lastErr := b.attemptsOf(t, id)
			assert.Zero(t, attempts)
			assert.Empty(t, lastErr)
		})
	})

	t.Run("NegativeMaxAttemptsIsRefused", func(t *testing.T) {
		t.Parallel()
		reg, err := outbox.NewRegistry()
		require.NoError(t, err)
		_, err = outbox.NewMiddleware(reg, outbox.MiddlewareConfig{MaxAttempts: -1}, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
	})

	t.Run("PoisonQueueDivertsTheAbandonedMessage", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			poisoned, err := gc.Subscribe(b.ctx(t), "poison")
			require.NoError(t, err)

			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			poison, err := middleware.PoisonQueueWithFilter(gc, "poison", outbox.IsAbandoned)
			require.NoError(t, err)
			mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{MaxAttempts: 3, Backoff: redeliverAtOnce}, b.logger)
			require.NoError(t, err)
			router.AddMiddleware(poison, mw) // the poison queue outside the outbox
			var mu sync.Mutex
			runs := 0
			router.AddNoPublisherHandler("consume", b.topic, gc, func(*message.Message) error {
				mu.Lock()
				defer mu.Unlock()
				runs++
				return errors.New("always fails")
			})
			runErr := make(chan error, 1)
			go func() { runErr <- router.Run(context.Background()) }()
			<-router.Running()

			pub, err := outbox.NewPublisher(b.reg, gc)
			require.NoError(t, err)
			sent := message.NewMessage(watermill.NewUUID(), []byte("poison pill"))
			require.NoError(t, pub.Publish(b.topic, sent))
			id := idOf(t, sent)

			select {
			case got := <-poisoned:
				got.Ack()
				assert.Equal(t, sent.UUID, got.UUID)
				assert.Empty(t, got.Metadata.Get(outbox.MetadataID))
				assert.Contains(t, got.Metadata.Get(middleware.ReasonForPoisonedKey), "abandoned after 3")
			case <-b.ctx(t).Done():
				t.Fatal("the abandoned message never reached the poison queue")
			}
			require.NoError(t, router.Close())
			require.NoError(t, <-runErr)
			mu.Lock()
			assert.Equal(t, 3, runs, "the handler ran MaxAttempts times")
			mu.Unlock()
			assert.ErrorIs(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), outbox.ErrNotPending)
		})
	})

	t.Run("AbandonedRecordIsRequeued", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{MaxAttempts: 1}, b.logger)
			require.NoError(t, err)
			_, err = mw((&recordingHandler{err: errors.New("boom")}).handle)(msg.Copy())
			require.True(t, outbox.IsAbandoned(err))

			gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			sub, err := gc.Subscribe(b.ctx(t), b.topic)
			require.NoError(t, err)
			// The decorated publisher is unwrapped: the record is sent
			// again, never saved a second time.
			decorated, err := outbox.NewPublisher(b.reg, gc)
			require.NoError(t, err)
			rows := b.rowCount(t)
			require.NoError(t, outboxops.Requeue(b.ctx(t), b.reg, decorated, b.topic, id))
			assert.Equal(t, rows, b.rowCount(t), "no second record")
			require.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), "pending again")
			got := <-sub
			got.Ack()
			assert.Equal(t, msg.UUID, got.UUID)
			assert.Equal(t, id, idOf(t, got), "sent with its original record id")
			attempts, _ := b.attemptsOf(t, id)
			assert.Zero(t, attempts, "attempts start over")

			err = outboxops.Requeue(b.ctx(t), b.reg, gc, b.topic, id)
			assert.ErrorIs(t, err, recordstore.ErrNotAbandoned, "a pending record is not requeued")
		})
	})
}
