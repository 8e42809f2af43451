package sqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestCompleteTxDoesNotStallOtherCompletions holds one CompleteTx
// transaction open on a record of "orders" while 20 deliveries of
// "payments", and a second copy of the open transaction's record, complete
// through the store's coalesced path: the 20 complete while the
// transaction is still open, and the copy waits for it alone. Topology: one
// store, two topics, one handler each, the default coalescing (one
// statement in flight), PostgreSQL and MariaDB; SQLite has one writer at a
// time, so there every completion waits for an open write transaction.
func TestCompleteTxDoesNotStallOtherCompletions(t *testing.T) {
	whileOneIsHeld(t, func(t *testing.T, ctx context.Context, store *sqlstore.Store, tx *sql.Tx, heldDelivery recordstore.Delivery, others []recordstore.Record) {
		// A copy of the held record completes outside the
		// transaction: it must wait for it, and only it.
		copyDone := make(chan error, 1)
		go func() { copyDone <- store.Complete(ctx, heldDelivery) }()

		// Completions that waited for the open transaction fail
		// with this deadline rather than hang the test.
		waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		done := make(chan error, len(others))
		for _, r := range others {
			go func() {
				done <- store.Complete(waitCtx, recordstore.Delivery{ID: r.ID, Topic: "payments", Consumer: "payments-handler"})
			}()
		}
		for range others {
			require.NoError(t, <-done, "a completion of another topic waited for the open transaction")
		}
		select {
		case err := <-copyDone:
			t.Fatalf("the copy of the held record did not wait for its transaction: %v", err)
		default:
		}
		require.NoError(t, tx.Commit())
		assert.ErrorIs(t, <-copyDone, recordstore.ErrNotPending, "the transaction completed it first")

		pending, err := store.PendingAfter(ctx, "payments", 0, 100)
		require.NoError(t, err)
		assert.Empty(t, pending)
	})
}

// TestCompleteBatchSkipsARowAnOpenTransactionHolds holds one CompleteTx
// transaction open on a record while one CompleteBatch call carries its
// delivery among those of 20 other records: the 20 complete together
// while the transaction is still open, and the held record's delivery
// waits for it alone, then finds it completed. Topology: one store, two
// topics, one handler each, the middleware's batch window (one
// CompleteBatch call), PostgreSQL and MariaDB; SQLite has one writer at a
// time.
func TestCompleteBatchSkipsARowAnOpenTransactionHolds(t *testing.T) {
	whileOneIsHeld(t, func(t *testing.T, ctx context.Context, store *sqlstore.Store, tx *sql.Tx, heldDelivery recordstore.Delivery, others []recordstore.Record) {
		ds := []recordstore.Delivery{heldDelivery}
		for _, r := range others {
			ds = append(ds, recordstore.Delivery{ID: r.ID, Topic: "payments", Consumer: "payments-handler", UUID: r.UUID})
		}
		batchDone := make(chan []error, 1)
		go func() { batchDone <- store.CompleteBatch(ctx, ds) }()

		// The 20 are complete while the transaction is open, and
		// the call still waits for the held record.
		require.Eventually(t, func() bool {
			pending, err := store.PendingAfter(ctx, "payments", 0, 100)
			return err == nil && len(pending) == 0
		}, 20*time.Second, 5*time.Millisecond, "the batch waited for the open transaction")
		select {
		case errs := <-batchDone:
			t.Fatalf("the held record's delivery did not wait for its transaction: %v", errs)
		default:
		}
		require.NoError(t, tx.Commit())
		errs := <-batchDone
		require.Len(t, errs, len(ds))
		assert.ErrorIs(t, errs[0], recordstore.ErrNotPending, "the transaction completed it first")
		for i, err := range errs[1:] {
			assert.NoError(t, err, "delivery %d", i+1)
		}
	})
}

// whileOneIsHeld runs test, on PostgreSQL and MariaDB in both completion
// modes, with a store holding one record of "orders" and 20 of
// "payments", while a CompleteTx transaction (tx, not yet committed)
// holds the record of "orders", whose delivery is held.
func whileOneIsHeld(t *testing.T, test func(t *testing.T, ctx context.Context, store *sqlstore.Store, tx *sql.Tx, held recordstore.Delivery, others []recordstore.Record)) {
	for _, b := range testenv.Backends() {
		if b.Name == "SQLite" {
			continue
		}
		for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
			t.Run(b.Name+"/"+mode.String(), func(t *testing.T) {
				db := b.Open(t)
				store := testenv.NewStore(t, b, db, mode)
				ctx := testCtx(t)
				held := []recordstore.Record{{Topic: "orders", UUID: "held", Payload: []byte("x")}}
				require.NoError(t, store.Insert(ctx, held))
				others := make([]recordstore.Record, 20)
				for i := range others {
					others[i] = recordstore.Record{Topic: "payments", UUID: "p" + string(rune('a'+i)), Payload: []byte("y")}
				}
				require.NoError(t, store.Insert(ctx, others))

				tx, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer tx.Rollback() //nolint:errcheck // committed by the test
				heldDelivery := recordstore.Delivery{ID: held[0].ID, Topic: "orders", Consumer: "orders-handler"}
				require.NoError(t, store.CompleteTx(ctx, tx, heldDelivery))
				test(t, ctx, store, tx, heldDelivery, others)
			})
		}
	}
}
