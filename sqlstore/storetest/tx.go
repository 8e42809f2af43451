package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func (s *suite) testInsertTx(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
		store := s.store(t, mode)

		tx, err := store.DB().BeginTxx(ctx(t), nil)
		require.NoError(t, err)
		committed := records("orders", 3)
		require.NoError(t, store.InsertTx(ctx(t), tx, committed))
		require.NoError(t, tx.Commit())

		tx, err = store.DB().BeginTxx(ctx(t), nil)
		require.NoError(t, err)
		rolledBack := records("orders", 2)
		require.NoError(t, store.InsertTx(ctx(t), tx.Tx, rolledBack), "a plain *sql.Tx works too")
		require.NoError(t, tx.Rollback())

		want := map[string]int64{}
		for _, r := range committed {
			require.Positive(t, r.ID)
			want[r.UUID] = r.ID
		}
		assert.Equal(t, want, rowIDs(t, store), "the committed records exist with the ids InsertTx set; the rolled-back ones do not")
	})
}

func (s *suite) testCompleteTx(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
		store := s.store(t, mode)
		recs := insert(t, store, records("orders", 2))
		committed, rolledBack := recs[0].ID, recs[1].ID

		tx, err := store.DB().BeginTxx(ctx(t), nil)
		require.NoError(t, err)
		require.NoError(t, store.CompleteTx(ctx(t), tx, dlv(committed)))
		require.NoError(t, tx.Commit())
		assert.ErrorIs(t, store.CheckPending(ctx(t), dlv(committed)), recordstore.ErrNotPending, "completed at commit")

		tx, err = store.DB().BeginTxx(ctx(t), nil)
		require.NoError(t, err)
		require.NoError(t, store.CompleteTx(ctx(t), tx, dlv(rolledBack)))
		require.NoError(t, tx.Rollback())
		assert.NoError(t, store.CheckPending(ctx(t), dlv(rolledBack)), "a rolled-back completion leaves the record pending")

		tx, err = store.DB().BeginTxx(ctx(t), nil)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck // test cleanup
		assert.ErrorIs(t, store.CompleteTx(ctx(t), tx, dlv(committed)), recordstore.ErrNotPending, "already completed")
		assert.ErrorIs(t, store.CompleteTx(ctx(t), tx, dlv(neverID)), recordstore.ErrNotPending, "never existed")
	})

	t.Run("ConcurrentCopyWaitsAndFindsItCompleted", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			id := insert(t, store, records("orders", 1))[0].ID

			first, err := store.DB().BeginTxx(ctx(t), nil)
			require.NoError(t, err)
			require.NoError(t, store.CompleteTx(ctx(t), first, dlv(id)))

			second := make(chan error, 1)
			go func() {
				// On PostgreSQL and MariaDB this waits for the row lock; on
				// SQLite (one connection per test pool) for the connection,
				// and with several connections for the write lock.
				tx, err := store.DB().BeginTxx(ctx(t), nil)
				if err != nil {
					second <- err
					return
				}
				defer tx.Rollback() //nolint:errcheck // only read
				second <- store.CompleteTx(ctx(t), tx, dlv(id))
			}()
			select {
			case err := <-second:
				t.Fatalf("the second completion returned (%v) while the first transaction held the record", err)
			default:
			}
			require.NoError(t, first.Commit())
			assert.ErrorIs(t, <-second, recordstore.ErrNotPending)
		})
	})
}

// testCompleteTxOfAnotherMessage: CompleteTx of a delivery that names
// another message than the record's completes nothing, with or without
// consumers, and the record's own message completes it in a transaction.
func (s *suite) testCompleteTxOfAnotherMessage(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
		store := s.store(t, mode)
		one := insert(t, store, records("orders", 1))[0]
		many := insert(t, store, withConsumers(1, twoConsumers...))[0]
		for _, c := range []struct {
			r recordstore.Record
			d recordstore.Delivery
		}{{one, dlv(one.ID)}, {many, consumerDlv(many.ID, "billing")}} {
			tx, err := store.DB().BeginTxx(ctx(t), nil)
			require.NoError(t, err)
			assert.ErrorIs(t, store.CompleteTx(ctx(t), tx, of(c.d, forged)), recordstore.ErrNotPending, "record %d", c.r.ID)
			require.NoError(t, tx.Commit())
			require.NoError(t, store.CheckPending(ctx(t), of(c.d, c.r.UUID)), "record %d is still pending for its own message", c.r.ID)

			tx, err = store.DB().BeginTxx(ctx(t), nil)
			require.NoError(t, err)
			require.NoError(t, store.CompleteTx(ctx(t), tx, of(c.d, c.r.UUID)))
			require.NoError(t, tx.Commit())
			assert.ErrorIs(t, store.CheckPending(ctx(t), of(c.d, c.r.UUID)), recordstore.ErrNotPending, "record %d", c.r.ID)
		}
	})
}

// testConsumers runs the per-consumer tests of InsertTx and CompleteTx.
func (s *suite) testConsumers(t *testing.T) {
	t.Run("InsertTxSavesDeliveriesWithTheTransaction", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			tx, err := store.DB().BeginTxx(ctx(t), nil)
			require.NoError(t, err)
			committed := withConsumers(2, twoConsumers...)
			require.NoError(t, store.InsertTx(ctx(t), tx, committed))
			require.NoError(t, tx.Commit())

			tx, err = store.DB().BeginTxx(ctx(t), nil)
			require.NoError(t, err)
			rolledBack := withConsumers(1, twoConsumers...)
			require.NoError(t, store.InsertTx(ctx(t), tx, rolledBack))
			require.NoError(t, tx.Rollback())

			for _, r := range committed {
				assert.Equal(t, 2, s.c.deliveryRows(t, store, r.ID))
				require.NoError(t, store.CheckPending(ctx(t), consumerDlv(r.ID, "shipping")))
			}
			assert.Zero(t, s.c.deliveryRows(t, store, rolledBack[0].ID))
			assert.Equal(t, 2, rowCount(t, store))
		})
	})

	t.Run("CompleteTxPerConsumer", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, mode sqlstore.Completion) {
			store := s.store(t, mode)
			id := insert(t, store, withConsumers(1, twoConsumers...))[0].ID
			billing, shipping := consumerDlv(id, "billing"), consumerDlv(id, "shipping")

			tx, err := store.DB().BeginTxx(ctx(t), nil)
			require.NoError(t, err)
			require.NoError(t, store.CompleteTx(ctx(t), tx, billing))
			require.NoError(t, tx.Rollback())
			require.NoError(t, store.CheckPending(ctx(t), billing), "a rolled-back completion leaves the delivery pending")

			tx, err = store.DB().BeginTxx(ctx(t), nil)
			require.NoError(t, err)
			require.NoError(t, store.CompleteTx(ctx(t), tx, billing))
			require.NoError(t, tx.Commit())
			assert.ErrorIs(t, store.CheckPending(ctx(t), billing), recordstore.ErrNotPending, "completed at commit")
			require.NoError(t, store.CheckPending(ctx(t), shipping))
			assert.Equal(t, []int64{id}, pendingIDs(t, store))

			// A second copy for shipping waits for the first transaction's
			// lock and then finds the delivery completed.
			first, err := store.DB().BeginTxx(ctx(t), nil)
			require.NoError(t, err)
			require.NoError(t, store.CompleteTx(ctx(t), first, shipping))
			second := make(chan error, 1)
			go func() {
				tx, err := store.DB().BeginTxx(ctx(t), nil)
				if err != nil {
					second <- err
					return
				}
				defer tx.Rollback() //nolint:errcheck // only read
				second <- store.CompleteTx(ctx(t), tx, shipping)
			}()
			select {
			case err := <-second:
				t.Fatalf("the second completion returned (%v) while the first transaction held the record", err)
			case <-time.After(100 * time.Millisecond):
			}
			require.NoError(t, first.Commit())
			assert.ErrorIs(t, <-second, recordstore.ErrNotPending)
			s.c.assertCompleted(t, store, mode, id)
		})
	})
}
