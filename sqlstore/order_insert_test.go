package sqlstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestInsertsOfOneKeyCommitInIDOrder: on PostgreSQL, an insert of a record
// with an order key waits while another transaction that inserted a record
// of the same key is open, and draws its id after that one commits; so the
// records of a key become visible in the order of their ids, and a record
// is never found pending after a later record of its key ran. A record of
// another key does not wait. Topology: two publishers of one store, one in
// a transaction (TxPublisher) and one on the pool.
func TestInsertsOfOneKeyCommitInIDOrder(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := testCtx(t)
	s := testenv.NewStore(t, testenv.Backends()[0], db, sqlstore.Delete)
	record := func(uuid, key string) []recordstore.Record {
		return []recordstore.Record{{Topic: "orders", UUID: uuid, Payload: []byte("x"), OrderKey: key}}
	}

	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // committed below
	first := record("first", "k")
	require.NoError(t, s.InsertTx(ctx, tx, first))

	other := record("other", "j")
	require.NoError(t, s.Insert(ctx, other), "a record of another key does not wait")

	second := record("second", "k")
	done := make(chan error, 1)
	go func() { done <- s.Insert(ctx, second) }()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, db.GetContext(ctx, &waiting, "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND query LIKE '%' || $1 || '%'", s.Table()))
		return waiting == 1
	}, 20*time.Second, 5*time.Millisecond, "the second insert of key k waits for the open transaction")
	select {
	case err := <-done:
		t.Fatalf("the second insert of key k returned (%v) while the first was not committed", err)
	default:
	}
	require.NoError(t, tx.Commit())
	require.NoError(t, <-done)
	assert.Greater(t, second[0].ID, first[0].ID, "the later insert drew the later id")
	before, err := s.Predecessors(ctx, "orders", []int64{second[0].ID})
	require.NoError(t, err)
	assert.Equal(t, first[0].ID, before[second[0].ID], "the second record waits for the first")
}
