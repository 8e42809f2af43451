package outbox_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// recordingHandler counts its runs and returns what it is told to.
type recordingHandler struct {
	runs    atomic.Int32
	err     error
	produce []*message.Message
	seen    func(msg *message.Message)
}

func (h *recordingHandler) handle(msg *message.Message) ([]*message.Message, error) {
	h.runs.Add(1)
	if h.seen != nil {
		h.seen(msg)
	}
	return h.produce, h.err
}

func idOf(t *testing.T, msg *message.Message) int64 {
	t.Helper()
	var id int64
	_, err := fmtSscan(msg.Metadata.Get(outbox.MetadataID), &id)
	require.NoError(t, err)
	return id
}

func TestMiddleware(t *testing.T) {
	t.Parallel()

	t.Run("SuccessMarksWithDatabaseClock", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			h := &recordingHandler{}

			var before, after string
			require.NoError(t, b.db.GetContext(b.ctx(t), &before, castNow(backend)))
			_, err := b.middleware(t)(h.handle)(msg)
			require.NoError(t, err)
			require.NoError(t, b.db.GetContext(b.ctx(t), &after, castNow(backend)))

			assert.EqualValues(t, 1, h.runs.Load())
			assert.ErrorIs(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), outbox.ErrNotPending)
			var processed string
			require.NoError(t, b.db.GetContext(b.ctx(t), &processed, b.db.Rebind(castProcessed(backend, b.store.Table())), id))
			assert.True(t, before <= processed && processed <= after,
				"processed_at %s comes from the database clock, between %s and %s", processed, before, after)
		})
	})

	t.Run("CopyOfCompletedRecordIsAckedWithoutHandler", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			dup := msg.Copy()
			h := &recordingHandler{}
			mw := b.middleware(t)(h.handle)

			_, err := mw(msg)
			require.NoError(t, err)
			_, err = mw(dup)
			require.NoError(t, err, "a copy of a completed record is acked")
			assert.EqualValues(t, 1, h.runs.Load(), "the handler runs once")
		})
	})

	t.Run("NeverExistingIDIsAckedWithoutHandler", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.ownMetadata(t, message.NewMessage("x", nil), "987654321")
			h := &recordingHandler{}
			_, err := b.middleware(t)(h.handle)(msg)
			require.NoError(t, err)
			assert.Zero(t, h.runs.Load())
			assert.Len(t, b.logger.Entries("info"), 1, "an id of its own table with no record is worth a warning")
		})
	})

	t.Run("CheckFailureNacksWithoutHandler", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			b.store.Attach(closedDB(t, backend)) // the database goes away
			h := &recordingHandler{}

			_, err := b.middleware(t)(h.handle)(msg)
			var fetchErr *outbox.CheckError
			require.ErrorAs(t, err, &fetchErr)
			assert.Equal(t, idOf(t, msg), fetchErr.ID)
			assert.Zero(t, h.runs.Load(), "the handler must not run when the record cannot be read")
		})
	})

	t.Run("DropCompletes", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			h := &recordingHandler{err: outbox.Drop(errors.New("unparseable order")), produce: []*message.Message{message.NewMessage("p", nil)}}
			produced, err := b.middleware(t)(h.handle)(msg)
			require.NoError(t, err, "a dropped message is acked")
			assert.Empty(t, produced, "a dropped message produces nothing")
			assert.ErrorIs(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), outbox.ErrNotPending)
		})
	})

	t.Run("ErrorLeavesPending", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			boom := errors.New("downstream unavailable")
			h := &recordingHandler{err: boom}
			mw := b.middleware(t)(h.handle)
			_, err := mw(msg)
			require.ErrorIs(t, err, boom)
			assert.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), "the record stays pending")
			assert.Equal(t, id, idOf(t, msg), "the outbox keys are back for an outer retry")

			h.err = nil // the redelivery succeeds
			_, err = mw(msg)
			require.NoError(t, err)
			assert.EqualValues(t, 2, h.runs.Load())
			assert.ErrorIs(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), outbox.ErrNotPending)
		})
	})

	t.Run("MarkFailureKeepsAckAndLeavesPending", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			liveDB := b.store.DB()
			h := &recordingHandler{seen: func(*message.Message) {
				// The database goes away while the handler runs.
				b.store.Attach(closedDB(t, backend))
			}}
			_, err := b.middleware(t)(h.handle)(msg)
			require.NoError(t, err, "the handler's success stands")

			errs := b.logger.Entries("error")
			require.Len(t, errs, 1)
			assert.Contains(t, errs[0].Msg, "stays pending")
			assert.EqualValues(t, id, errs[0].Fields["outbox_id"])

			b.store.Attach(liveDB)
			assert.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), "the record waits for the next replay")
		})
	})

	t.Run("DeletingStoreDeletes", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Delete)
			msg := b.publishTracked(t, 1)[0]
			dup := msg.Copy()
			require.Equal(t, 1, b.rowCount(t))
			h := &recordingHandler{}
			mw := b.middleware(t)(h.handle)
			_, err := mw(msg)
			require.NoError(t, err)
			assert.Zero(t, b.rowCount(t), "the completed record is deleted")
			_, err = mw(dup)
			require.NoError(t, err)
			assert.EqualValues(t, 1, h.runs.Load(), "a copy of a deleted record is acked unhandled")
		})
	})

	t.Run("HandlerSeesRecordButNoOutboxKeys", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			var ref outbox.RecordRef
			var ok bool
			var keyInHandler string
			h := &recordingHandler{seen: func(m *message.Message) {
				ref, ok = outbox.RecordFromContext(m.Context())
				keyInHandler = m.Metadata.Get(outbox.MetadataID)
			}}
			_, err := b.middleware(t)(h.handle)(msg)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, outbox.RecordRef{Topic: b.topic, ID: id}, ref)
			assert.Empty(t, keyInHandler, "a forwarded message must not carry a stale record id")
		})
	})

	t.Run("ProducedMessagesCompleteOnlyAfterAck", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msgs := b.publishTracked(t, 2)
			h := &recordingHandler{produce: []*message.Message{message.NewMessage("out", nil)}}
			mw := b.middleware(t)(h.handle)

			nacked, acked := msgs[0], msgs[1]
			nackedID, ackedID := idOf(t, nacked), idOf(t, acked)
			// The router could not publish the produced message: nack.
			_, err := mw(nacked)
			require.NoError(t, err)
			require.True(t, nacked.Nack())
			// The router published it: ack.
			_, err = mw(acked)
			require.NoError(t, err)
			require.True(t, acked.Ack())

			require.Eventually(t, func() bool {
				return errors.Is(b.store.CheckPending(b.ctx(t), b.delivery(ackedID)), outbox.ErrNotPending)
			}, 10*time.Second, 5*time.Millisecond, "the acked message's record completes")
			assert.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(nackedID)), "the nacked message's record stays pending")
		})
	})

	t.Run("MalformedIDRunsOnceUntrackedWithError", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			pending := b.publishTracked(t, 1)[0]
			bads := []string{"", "-1", "0", "abc", "1; DROP TABLE x", "99999999999999999999", "+5", "05"}
			for _, bad := range bads {
				msg := b.ownMetadata(t, message.NewMessage("x", nil), bad)
				h := &recordingHandler{}
				_, err := b.middleware(t)(h.handle)(msg)
				require.NoError(t, err, "id %q is acked: nacking would bring it back without end", bad)
				assert.EqualValues(t, 1, h.runs.Load(), "id %q runs once, untracked", bad)
			}
			errs := b.logger.Entries("error")
			require.Len(t, errs, len(bads))
			assert.ErrorIs(t, errs[0].Err, outbox.ErrInvalidMetadata)
			assert.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(idOf(t, pending))), "no record was touched")
		})
	})

	t.Run("UnknownTopicRunsHandlerUntrackedAndLogs", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := message.NewMessage("x", nil)
			msg.Metadata.Set(outbox.MetadataID, "1")
			msg.Metadata.Set(outbox.MetadataTopic, "someone_elses_topic")
			h := &recordingHandler{}
			_, err := b.middleware(t)(h.handle)(msg)
			require.NoError(t, err)
			assert.EqualValues(t, 1, h.runs.Load())
			assert.Empty(t, b.logger.Entries("error"), "receiving another service's tracked messages is normal")
		})
	})
}
