package outbox_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// txBacklog sizes the two-instance test. On SQLite the two pools contend
// for its one write lock and wait in its busy handler: 10,000 records take
// about a minute on an idle 2-core machine and several under load.
var txBacklog = flag.Int("tx.backlog", 1_000,
	"records replayed by the two instances of TestTransactionalCompletionTwoInstancesExactlyOnce")

func watermillUUID(i int) string { return fmt.Sprintf("msg-%05d", i) }

// completingStore counts the middleware's own completions.
type completingStore struct {
	*sqlstore.Store
	completes atomic.Int32
}

func (s *completingStore) Complete(ctx context.Context, d recordstore.Delivery) error {
	s.completes.Add(1)
	return s.Store.Complete(ctx, d)
}

func (s *completingStore) CompleteBatch(ctx context.Context, ds []recordstore.Delivery) []error {
	s.completes.Add(int32(len(ds)))
	return s.Store.CompleteBatch(ctx, ds)
}

// txHandler is a handler whose business write and completion commit
// together: CompleteTx first, then the effect, then the commit.
type txHandler struct {
	db *sqlx.DB
	fx string
	// locked, when set, is called once the record is locked in the
	// transaction, before the business write.
	locked func()
	// fail makes the handler roll back and return an error.
	fail     bool
	effects  atomic.Int64
	absorbed atomic.Int64 // copies that found the record completed in CompleteTx
}

func (h *txHandler) handle(msg *message.Message) error {
	ctx := msg.Context()
	tx, err := h.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // rolled back unless committed
	switch err := outbox.CompleteTx(ctx, tx, msg); {
	case errors.Is(err, outbox.ErrNotPending):
		h.absorbed.Add(1)
		return nil
	case err != nil:
		return err
	}
	if h.locked != nil {
		h.locked()
	}
	ref, _ := outbox.RecordFromContext(ctx)
	if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+h.fx+" (record_id) VALUES (?)"), ref.ID); err != nil {
		return err
	}
	if h.fail {
		return errors.New("business rule refused")
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	h.effects.Add(1)
	return nil
}

func TestCompleteTx(t *testing.T) {
	t.Parallel()

	t.Run("CompletesWithTheBusinessWriteAndTheMiddlewareSkipsItsMark", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			fx := effectsTable(t, b)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			counting := &completingStore{Store: b.store}
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: counting})
			require.NoError(t, err)
			mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
			require.NoError(t, err)

			h := &txHandler{db: b.db, fx: fx}
			_, err = mw(noPublish(h.handle))(msg)
			require.NoError(t, err)
			assert.ErrorIs(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), outbox.ErrNotPending)
			assert.Equal(t, 1, countRows(t, b.db, "SELECT COUNT(*) FROM "+fx))
			assert.Zero(t, counting.completes.Load(), "the middleware does not complete again")
		})
	})

	t.Run("RollbackLeavesThePendingRecordAndNacks", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			fx := effectsTable(t, b)
			msg := b.publishTracked(t, 1)[0]
			id := idOf(t, msg)
			h := &txHandler{db: b.db, fx: fx, fail: true}
			_, err := b.middleware(t)(noPublish(h.handle))(msg)
			require.Error(t, err)
			assert.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), "still pending")
			assert.Zero(t, countRows(t, b.db, "SELECT COUNT(*) FROM "+fx))
			assert.Equal(t, id, idOf(t, msg), "the outbox keys are back for the redelivery")
		})
	})

	// A handler that rolls back after CompleteTx and returns nil has its
	// message acked; the middleware skips its own completion, so the
	// record stays pending and replay sends it again, as documented.
	t.Run("RollbackThenNilAcksAndLeavesThePendingRecordForReplay", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Backends()[1], sqlstore.Mark)
		msg := b.publishTracked(t, 1)[0]
		id := idOf(t, msg)
		_, err := b.middleware(t)(func(m *message.Message) ([]*message.Message, error) {
			tx, err := b.db.BeginTxx(m.Context(), nil)
			if err != nil {
				return nil, err
			}
			if err := outbox.CompleteTx(m.Context(), tx, m); err != nil {
				return nil, err
			}
			return nil, tx.Rollback()
		})(msg)
		require.NoError(t, err, "acked")
		assert.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), "still pending: the next replay sends it")
		assert.Equal(t, 1, b.pendingCount(t))
	})

	t.Run("UntrackedMessageIsANoOp", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Backends()[0], sqlstore.Mark)
		tx, err := b.db.BeginTxx(b.ctx(t), nil)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck // nothing to keep
		require.NoError(t, outbox.CompleteTx(b.ctx(t), tx, message.NewMessage("a", nil)))
	})

	t.Run("StoreWithoutCompleteTxIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Backends()[0], sqlstore.Mark)
		msg := b.publishTracked(t, 1)[0]
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: plainStore{b.store}})
		require.NoError(t, err)
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
		require.NoError(t, err)
		h := &txHandler{db: b.db, fx: effectsTable(t, b)}
		_, err = mw(noPublish(h.handle))(msg)
		assert.ErrorIs(t, err, outbox.ErrNotSupported)
	})

	t.Run("ConcurrentCopyWaitsForTheLockAndHasNoEffect", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b, inst, fx := instances(t, backend, 2, 0)
			msg := b.publishTracked(t, 1)[0]
			copyA, copyB := msg.Copy(), msg.Copy()

			lockedA, releaseA := make(chan struct{}), make(chan struct{})
			hA := &txHandler{db: inst[0].db, fx: fx, locked: func() { close(lockedA); <-releaseA }}
			hB := &txHandler{db: inst[1].db, fx: fx}
			entered := make(chan struct{})
			handlerB := func(m *message.Message) error { close(entered); return hB.handle(m) }

			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, err := inst[0].mw(noPublish(hA.handle))(copyA)
				assert.NoError(t, err)
			}()
			<-lockedA
			go func() {
				defer wg.Done()
				_, err := inst[1].mw(noPublish(handlerB))(copyB)
				assert.NoError(t, err)
			}()
			<-entered // B saw the record pending and runs its handler
			close(releaseA)
			wg.Wait()

			assert.EqualValues(t, 1, hA.effects.Load())
			assert.EqualValues(t, 0, hB.effects.Load())
			assert.EqualValues(t, 1, hB.absorbed.Load(), "the second copy found the record completed once it got the lock")
			assert.Equal(t, 1, countRows(t, b.db, "SELECT COUNT(*) FROM "+fx), "exactly one business effect")
		})
	})
}

// TestTransactionalCompletionTwoInstancesExactlyOnce starts two instances
// on one backlog of 10,000 records; both replay it at once into their own
// broker, so every record is delivered up to twice at about the same moment, and
// every handler completes in its business transaction. Each record has
// exactly one business effect.
func TestTransactionalCompletionTwoInstancesExactlyOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		backlog := *txBacklog
		b, inst, fx := instances(t, backend, 2, 0)
		b.backlog(t, backlog)

		handlers := []*txHandler{{db: inst[0].db, fx: fx}, {db: inst[1].db, fx: fx}}
		acked, failed := replayTogether(t, b, inst, []func(*message.Message) error{handlers[0].handle, handlers[1].handle}, backlog)

		effects := handlers[0].effects.Load() + handlers[1].effects.Load()
		absorbed := handlers[0].absorbed.Load() + handlers[1].absorbed.Load()
		t.Logf("%s: %d records, %d deliveries acked, %d nacked and redelivered, %d effects (%d / %d), %d copies waited for the lock and found the record completed",
			backend.Name, backlog, acked, failed, effects, handlers[0].effects.Load(), handlers[1].effects.Load(), absorbed)
		assert.Equal(t, backlog, countRows(t, b.db, "SELECT COUNT(*) FROM "+fx), "exactly one business effect per record")
		assert.Equal(t, backlog, countRows(t, b.db, "SELECT COUNT(DISTINCT record_id) FROM "+fx))
		assert.EqualValues(t, backlog, effects)
		assert.Zero(t, b.pendingCount(t))
	})
}

// noPublish adapts a handler that publishes nothing.
func noPublish(h func(*message.Message) error) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
}
