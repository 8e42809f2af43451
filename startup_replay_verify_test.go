package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// verifyCounter is a store that counts the Verify calls it passes on.
type verifyCounter struct {
	*sqlstore.Store
	calls atomic.Int32
}

func (v *verifyCounter) Verify(ctx context.Context) error {
	v.calls.Add(1)
	return v.Store.Verify(ctx)
}

// plainStore hides Verify: a store that cannot verify itself.
type plainStore struct{ recordstore.Store }

func TestReplayVerifiesStores(t *testing.T) {
	t.Parallel()

	t.Run("MissingTableStopsRunNamingTableAndRemedy", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			db := backend.Open(t)
			table := testenv.Table(t)
			store, err := sqlstore.New(sqlstore.Config{Dialect: backend.Dialect, Table: table, DB: db})
			require.NoError(t, err)
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
			require.NoError(t, err)
			b := &bundle{backend: backend, db: db, store: store, reg: reg, topic: "orders", logger: &testenv.CaptureLogger{}}
			handled := newHandledSet(1)
			router, _ := restartedService(t, b, handled, nil, outbox.ReplayConfig{})

			err = router.Run(context.Background())
			var verifyErr *outbox.VerifyError
			require.ErrorAs(t, err, &verifyErr, "the router does not start")
			assert.Equal(t, "orders", verifyErr.Topic)
			assert.ErrorIs(t, err, sqlstore.ErrTableMissing)
			assert.Contains(t, err.Error(), table)
			assert.Contains(t, err.Error(), "Store.Migrate")
		})
	})

	t.Run("NewerSchemaStopsReplayBeforeAnythingIsSent", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, 2)
			_, err := b.db.ExecContext(b.ctx(t), b.db.Rebind("UPDATE "+sqlstore.VersionTable+" SET version = 99 WHERE table_name = ?"), b.store.Table())
			require.NoError(t, err)
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			defer gc.Close()
			sent := &recordingPublisher{Publisher: gc}

			_, err = outbox.Replay(b.ctx(t), b.reg, sent, outbox.ReplayConfig{}, nil)
			var verifyErr *outbox.VerifyError
			require.ErrorAs(t, err, &verifyErr)
			assert.ErrorIs(t, err, sqlstore.ErrSchemaVersion)
			assert.Contains(t, err.Error(), "version 99")
			assert.Empty(t, sent.msgs, "nothing is sent from a table the code does not understand")
			assert.Equal(t, 2, b.pendingCount(t))
		})
	})

	t.Run("UnreachableDatabaseStopsRun", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, 1)
			b.store.Attach(closedDB(t, backend))
			router, _ := restartedService(t, b, newHandledSet(1), nil, outbox.ReplayConfig{})

			var verifyErr *outbox.VerifyError
			require.ErrorAs(t, router.Run(context.Background()), &verifyErr, "the router does not start")
			assert.Equal(t, b.topic, verifyErr.Topic)
		})
	})

	t.Run("EachDistinctStoreOnceAndOthersAsTheyAre", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, 1)
			shared := &verifyCounter{Store: b.store}
			reg, err := outbox.NewRegistry(
				outbox.Tracked{Topic: b.topic, Store: shared},
				outbox.Tracked{Topic: "also_" + b.topic, Store: shared},
				outbox.Tracked{Topic: "plain_" + b.topic, Store: plainStore{b.store}},
			)
			require.NoError(t, err)
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			defer gc.Close()

			res, err := outbox.Replay(b.ctx(t), reg, gc, outbox.ReplayConfig{}, nil)
			require.NoError(t, err)
			assert.EqualValues(t, 1, shared.calls.Load(), "a store shared by two names is verified once")
			assert.Equal(t, 1, res[b.topic], "a store that cannot verify itself is replayed as it is")
		})
	})
}
