package storetest

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func (s *contract) testIdentity(t *testing.T) {
	t.Run("StableAndOwnToTheStore", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			id, err := store.Identity(ctx(t))
			require.NoError(t, err)
			assert.NotEmpty(t, id)
			again, err := store.Identity(ctx(t))
			require.NoError(t, err)
			assert.Equal(t, id, again, "the identity is stable")
			other, err := s.store(t, mode).Identity(ctx(t))
			require.NoError(t, err)
			assert.NotEqual(t, id, other, "another store has another identity")
		})
	})

	t.Run("ConcurrentCallersReadOne", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		ids := make([]string, 8)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				var err error
				ids[i], err = store.Identity(ctx(t))
				assert.NoError(t, err)
			})
		}
		wg.Wait()
		for _, id := range ids {
			assert.Equal(t, ids[0], id)
		}
	})
}

// testIdentity runs the identity tests that read the version table.
func (s *suite) testIdentity(t *testing.T) {
	t.Run("StableOnOneTableDifferentAcrossTables", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			id, err := store.Identity(ctx(t))
			require.NoError(t, err)
			assert.Regexp(t, "^[0-9a-f]{32}$", id)

			again, err := sqlstore.New(sqlstore.Config{Dialect: store.Dialect(), Table: store.Table(), Completion: mode, DB: store.DB()})
			require.NoError(t, err)
			got, err := again.Identity(ctx(t))
			require.NoError(t, err)
			assert.Equal(t, id, got, "every store value on the table has its identity")

			other := s.store(t, mode)
			otherID, err := other.Identity(ctx(t))
			require.NoError(t, err)
			assert.NotEqual(t, id, otherID, "another table has another identity")

			require.NoError(t, again.Migrate(ctx(t)))
			require.NoError(t, again.Migrate(ctx(t)))
			fresh, err := sqlstore.New(sqlstore.Config{Dialect: store.Dialect(), Table: store.Table(), Completion: mode, DB: store.DB()})
			require.NoError(t, err)
			got, err = fresh.Identity(ctx(t))
			require.NoError(t, err)
			assert.Equal(t, id, got, "migrating again keeps the identity")
		})
	})

	t.Run("BeforeMigrateSaysToMigrate", func(t *testing.T) {
		t.Parallel()
		store := s.bare(t, sqlstore.Mark)
		_, err := store.Identity(ctx(t))
		require.ErrorIs(t, err, sqlstore.ErrTableMissing)
		assert.Contains(t, err.Error(), store.Table())
		assert.Contains(t, err.Error(), "Store.Migrate")

		require.NoError(t, store.Migrate(ctx(t)))
		id, err := store.Identity(ctx(t))
		require.NoError(t, err, "a failed read is not cached")
		assert.NotEmpty(t, id)
	})

	t.Run("VerifyNeedsTheIdentity", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, sqlstore.Mark)
		db := store.DB()
		versions, key := versionRow(store)
		_, err := db.ExecContext(ctx(t), db.Rebind("UPDATE "+versions+" SET table_identity = NULL WHERE table_name = ?"), key)
		require.NoError(t, err)
		err = store.Verify(ctx(t))
		require.ErrorIs(t, err, sqlstore.ErrSchemaVersion)
		assert.Contains(t, err.Error(), "Store.Migrate")
		require.NoError(t, store.Migrate(ctx(t)), "Migrate gives the table an identity again")
		require.NoError(t, store.Verify(ctx(t)))
	})
}

// preConsumersVersion is the schema version before per-consumer deliveries
// and table identities.
const preConsumersVersion = 3

// testUpgrade upgrades a table of the release before consumers, with
// records in every state, in place.
func (s *suite) testUpgrade(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
		store := s.bare(t, mode)
		require.NoError(t, store.MigrateTo(ctx(t), preConsumersVersion))
		_, err := store.Identity(ctx(t))
		require.ErrorIs(t, err, sqlstore.ErrSchemaVersion, "a version-3 table has no identity")
		assert.Contains(t, err.Error(), "Store.Migrate")
		require.ErrorIs(t, store.Verify(ctx(t)), sqlstore.ErrSchemaVersion)

		// Written as the release before consumers wrote them: one INSERT,
		// then its own completion and failure statements.
		recs := insert(t, store, records("orders", 4))
		db, table := store.DB(), store.Table()
		exec := func(q string, args ...any) {
			t.Helper()
			_, err := db.ExecContext(ctx(t), db.Rebind(q), args...)
			require.NoError(t, err)
		}
		if mode == sqlstore.Mark {
			exec("UPDATE "+table+" SET processed_at = created_at WHERE id = ?", recs[0].ID)
			exec("UPDATE "+table+" SET attempts = 1, last_error = 'poison', abandoned_at = created_at, processed_at = created_at WHERE id = ?", recs[1].ID)
		} else {
			exec("DELETE FROM "+table+" WHERE id = ?", recs[0].ID)
			exec("UPDATE "+table+" SET attempts = 1, last_error = 'poison', abandoned_at = created_at WHERE id = ?", recs[1].ID)
		}
		exec("UPDATE "+table+" SET attempts = 2, last_error = 'flaky' WHERE id = ?", recs[2].ID)

		require.NoError(t, store.Migrate(ctx(t)))
		require.NoError(t, store.Verify(ctx(t)))
		id, err := store.Identity(ctx(t))
		require.NoError(t, err)
		assert.Regexp(t, "^[0-9a-f]{32}$", id, "the upgraded table has an identity")

		pending, err := store.PendingAfter(ctx(t), "orders", 0, 10)
		require.NoError(t, err)
		require.Equal(t, []int64{recs[2].ID, recs[3].ID}, claimedIDs(pending), "pending records stay pending, the others stay as they were")
		assert.Equal(t, recs[2].UUID, pending[0].UUID)
		assert.Equal(t, recs[2].Payload, pending[0].Payload)
		assert.Equal(t, recs[2].Metadata, pending[0].Metadata)

		assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(recs[0].ID)), recordstore.ErrNotPending, "completed before the upgrade")
		assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(recs[1].ID)), recordstore.ErrNotPending, "abandoned before the upgrade")
		require.NoError(t, store.CheckPending(ctx(t), dlv(recs[2].ID)))
		n, abandoned, err := store.RecordFailure(ctx(t), dlv(recs[2].ID), "again", 3, nil)
		require.NoError(t, err)
		assert.Equal(t, 3, n, "the attempts so far are kept")
		assert.True(t, abandoned)
		require.NoError(t, store.Complete(ctx(t), dlv(recs[3].ID)), "an old record completes as one with one receiver")

		got, err := store.Requeue(ctx(t), recs[1].ID)
		require.NoError(t, err, "a record abandoned before the upgrade can be requeued")
		assert.Equal(t, recs[1].UUID, got.UUID)

		// New records, with consumers, live beside the old ones.
		withConsumers := records("orders", 1)
		withConsumers[0].Consumers = []string{"billing", "shipping"}
		insert(t, store, withConsumers)
		require.NoError(t, store.CheckPending(ctx(t), consumerDlv(withConsumers[0].ID, "billing")))
		assert.ErrorIs(t, store.CheckPending(ctx(t), consumerDlv(withConsumers[0].ID, "audit")), recordstore.ErrNoDelivery)
	})
}
