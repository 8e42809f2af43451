package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
	"github.com/wmoutbox/outbox/sqlstore/storetest"
)

// span is the id range of one partition.
const span = int64(1) << 36

// partitionedStore is a migrated partitioned store on a fresh PostgreSQL
// table, dropped when the test ends.
func partitionedStore(t *testing.T, db *sqlx.DB) *sqlstore.Store {
	t.Helper()
	table := testenv.Table(t)
	s, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres(), Table: table, Completion: sqlstore.Mark, DB: db, PartitionEvery: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { testenv.DropTable(t, db, sqlstore.Postgres(), table) })
	require.NoError(t, s.Migrate(testCtx(t)))
	return s
}

// partitionNames lists the partitions of the store's table that exist,
// attached or not.
func partitionNames(t *testing.T, db *sqlx.DB, s *sqlstore.Store) []string {
	t.Helper()
	var names []string
	require.NoError(t, db.SelectContext(testCtx(t), &names,
		"SELECT relname FROM pg_class WHERE relkind = 'r' AND starts_with(relname, $1) ORDER BY relname", s.Table()+"_p"))
	return names
}

// complete completes each record for the delivery "handler".
func complete(t *testing.T, s *sqlstore.Store, recs ...recordstore.Record) {
	t.Helper()
	for _, r := range recs {
		require.NoError(t, s.Complete(testCtx(t), recordstore.Delivery{ID: r.ID, Topic: r.Topic, Consumer: "handler"}))
	}
}

// completedLongAgo moves the completion of every completed record of the
// store's table two hours back, and analyzes the table, so that the count
// of a dropped partition, PostgreSQL's estimate, is exact.
func completedLongAgo(t *testing.T, db *sqlx.DB, s *sqlstore.Store) {
	t.Helper()
	_, err := db.ExecContext(testCtx(t), "UPDATE "+s.Table()+" SET processed_at = processed_at - interval '2 hours' WHERE processed_at IS NOT NULL")
	require.NoError(t, err)
	_, err = db.ExecContext(testCtx(t), "VACUUM ANALYZE "+s.Table())
	require.NoError(t, err)
}

func ordersOf(n int, uuid string) []recordstore.Record {
	recs := make([]recordstore.Record, n)
	for i := range recs {
		recs[i] = recordstore.Record{Topic: "orders", UUID: fmt.Sprintf("%s%d", uuid, i), Payload: []byte("{}")}
	}
	return recs
}

func TestPartitionEveryIsRefusedWhereItCannotWork(t *testing.T) {
	t.Parallel()
	for _, cfg := range []sqlstore.Config{
		{Dialect: sqlstore.SQLite(), PartitionEvery: time.Hour},
		{Dialect: sqlstore.MySQL(), PartitionEvery: time.Hour},
		{Dialect: sqlstore.Postgres(), Completion: sqlstore.Delete, PartitionEvery: time.Hour},
		{Dialect: sqlstore.Postgres(), PartitionEvery: -time.Hour},
	} {
		_, err := sqlstore.New(cfg)
		assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig, "%s %v %v", cfg.Dialect.Name(), cfg.Completion, cfg.PartitionEvery)
	}
	s, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres()})
	require.NoError(t, err)
	assert.ErrorIs(t, s.Rotate(context.Background()), sqlstore.ErrInvalidConfig, "a table of one piece has no partition to start")
}

// TestPartitionedTableDropsOldPartitionsWhole: records saved after a
// rotation go to the next partition, and every statement reads across
// partitions; the Cleaner drops an earlier partition once all its records
// were completed longer ago than OlderThan, with their delivery rows, and
// deletes none of them one by one before.
func TestPartitionedTableDropsOldPartitionsWhole(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testenv.Postgres(t)
	s := partitionedStore(t, db)
	first := ordersOf(3, "a")
	require.NoError(t, s.Insert(ctx, first))
	first = append(first, recordstore.Record{Topic: "orders", UUID: "fan", Payload: []byte("{}"), Consumers: []string{"billing", "shipping"}})
	require.NoError(t, s.Insert(ctx, first[3:]))
	require.NoError(t, s.Rotate(ctx))
	second := ordersOf(2, "b")
	require.NoError(t, s.Insert(ctx, second))
	assert.Less(t, first[3].ID, span)
	assert.GreaterOrEqual(t, second[0].ID, span, "a record saved after the rotation is in the next partition")
	assert.Equal(t, []string{s.Table() + "_p0", s.Table() + "_p1"}, partitionNames(t, db, s))

	pending, err := s.PendingAfter(ctx, "orders", 0, 10)
	require.NoError(t, err)
	require.Len(t, pending, 6)
	assert.Equal(t, first[0].ID, pending[0].ID)
	assert.Equal(t, second[1].ID, pending[5].ID, "a replay reads both partitions in order")

	complete(t, s, first[:3]...)
	complete(t, s, second...)
	for _, c := range []string{"billing", "shipping"} {
		require.NoError(t, s.Complete(ctx, recordstore.Delivery{ID: first[3].ID, Topic: "orders", Consumer: c}))
	}
	n, err := s.Clean(ctx, time.Hour, 100)
	require.NoError(t, err)
	assert.Zero(t, n, "a partition completed recently is kept")
	assert.Len(t, partitionNames(t, db, s), 2)

	completedLongAgo(t, db, s)
	n, err = s.Clean(ctx, time.Hour, 100)
	require.NoError(t, err)
	assert.Equal(t, 4+2, n, "the earlier partition dropped with its 4 records, and the current one's 2 old records deleted one by one")
	assert.Equal(t, []string{s.Table() + "_p1"}, partitionNames(t, db, s))
	var deliveries int
	require.NoError(t, db.GetContext(ctx, &deliveries, "SELECT COUNT(*) FROM "+s.Table()+"_consumers"))
	assert.Zero(t, deliveries, "the delivery rows of the dropped records go too")
	var left int
	require.NoError(t, db.GetContext(ctx, &left, "SELECT COUNT(*) FROM "+s.Table()))
	assert.Zero(t, left)
	n, err = s.Clean(ctx, time.Hour, 100)
	require.NoError(t, err)
	assert.Zero(t, n)
}

// TestPartitionedTableKeepsAPartitionWithUnfinishedRecords: a pending or
// abandoned record keeps its partition; the partition's old completed
// records are deleted one by one meanwhile, and the partition is dropped
// once the record is completed.
func TestPartitionedTableKeepsAPartitionWithUnfinishedRecords(t *testing.T) {
	t.Parallel()
	for _, unfinished := range []string{"pending", "abandoned"} {
		t.Run(unfinished, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			db := testenv.Postgres(t)
			s := partitionedStore(t, db)
			recs := ordersOf(3, "a")
			require.NoError(t, s.Insert(ctx, recs))
			complete(t, s, recs[:2]...)
			if unfinished == "abandoned" {
				_, abandoned, err := s.RecordFailure(ctx, recordstore.Delivery{ID: recs[2].ID, Topic: "orders", Consumer: "handler"}, "poison", 1, nil)
				require.NoError(t, err)
				require.True(t, abandoned)
			}
			require.NoError(t, s.Rotate(ctx))
			completedLongAgo(t, db, s)

			n, err := s.Clean(ctx, time.Hour, 1)
			require.NoError(t, err)
			assert.Equal(t, 1, n, "one batch of the kept partition's old completed records")
			n, err = s.Clean(ctx, time.Hour, 10)
			require.NoError(t, err)
			assert.Equal(t, 1, n)
			assert.Equal(t, []string{s.Table() + "_p0", s.Table() + "_p1"}, partitionNames(t, db, s), "the partition stays")
			pending, err := s.PendingAfter(ctx, "orders", 0, 10)
			require.NoError(t, err)
			if unfinished == "abandoned" {
				assert.Empty(t, pending)
				_, err := s.Requeue(ctx, recs[2].ID)
				require.NoError(t, err)
				pending, err = s.PendingAfter(ctx, "orders", 0, 10)
				require.NoError(t, err)
			}
			require.Len(t, pending, 1)
			assert.Equal(t, recs[2].ID, pending[0].ID)
			complete(t, s, recs[2])
			completedLongAgo(t, db, s)
			n, err = s.Clean(ctx, time.Hour, 10)
			require.NoError(t, err)
			assert.Equal(t, 1, n, "dropped once its last record is complete")
			assert.Equal(t, []string{s.Table() + "_p1"}, partitionNames(t, db, s))
		})
	}
}

// TestPartitionedTableRotatesWhenDue: Clean starts the next partition once
// the current one's first record is older than PartitionEvery, and not
// before; a second rotation in a row moves on from there.
func TestPartitionedTableRotatesWhenDue(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testenv.Postgres(t)
	s := partitionedStore(t, db)
	n, err := s.Clean(ctx, time.Hour, 10)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Len(t, partitionNames(t, db, s), 1, "an empty partition is not due")
	recs := ordersOf(2, "a")
	require.NoError(t, s.Insert(ctx, recs))
	_, err = s.Clean(ctx, time.Hour, 10)
	require.NoError(t, err)
	assert.Len(t, partitionNames(t, db, s), 1, "a partition younger than PartitionEvery is not due")

	_, err = db.ExecContext(ctx, "UPDATE "+s.Table()+" SET created_at = created_at - interval '61 minutes' WHERE id = $1", recs[0].ID)
	require.NoError(t, err)
	_, err = s.Clean(ctx, time.Hour, 10)
	require.NoError(t, err)
	assert.Len(t, partitionNames(t, db, s), 2)
	later := ordersOf(1, "b")
	require.NoError(t, s.Insert(ctx, later))
	assert.Equal(t, span, later[0].ID, "the first id of the next partition")

	require.NoError(t, s.Rotate(ctx))
	require.NoError(t, s.Rotate(ctx))
	last := ordersOf(1, "c")
	require.NoError(t, s.Insert(ctx, last))
	assert.Equal(t, 3*span, last[0].ID)
	assert.Len(t, partitionNames(t, db, s), 4)
}

// TestPartitionedTableKeepsALateRecord: a record whose insert commits
// while the Cleaner drops its partition (its transaction took an id of the
// partition before the rotation) is found by the check after the detach;
// the partition is attached again and the record stays pending.
func TestPartitionedTableKeepsALateRecord(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testenv.Postgres(t)
	s := partitionedStore(t, db)
	done := ordersOf(2, "a")
	require.NoError(t, s.Insert(ctx, done))
	complete(t, s, done...)
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // committed below
	late := ordersOf(1, "late")
	require.NoError(t, s.InsertTx(ctx, tx, late))
	require.Less(t, late[0].ID, span)
	require.NoError(t, s.Rotate(ctx))
	completedLongAgo(t, db, s)

	cleaned := make(chan error, 1)
	go func() {
		_, err := s.Clean(ctx, time.Hour, 10)
		cleaned <- err
	}()
	// The detach waits for the open transaction.
	require.Eventually(t, func() bool {
		var waiting bool
		err := db.GetContext(ctx, &waiting, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE '%DETACH PARTITION%CONCURRENTLY%' AND state = 'active' AND wait_event_type = 'Lock')")
		return err == nil && waiting
	}, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, tx.Commit())
	require.NoError(t, <-cleaned)

	assert.Equal(t, []string{s.Table() + "_p0", s.Table() + "_p1"}, partitionNames(t, db, s))
	pending, err := s.PendingAfter(ctx, "orders", 0, 10)
	require.NoError(t, err)
	require.Len(t, pending, 1, "the late record is attached again, pending")
	assert.Equal(t, late[0].ID, pending[0].ID)
	require.NoError(t, s.Verify(ctx))

	complete(t, s, late...)
	completedLongAgo(t, db, s)
	n, err := s.Clean(ctx, time.Hour, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the other two were deleted one by one while the late record kept the partition")
	assert.Equal(t, []string{s.Table() + "_p1"}, partitionNames(t, db, s))
}

// TestPartitionedTableSkipsDuplicateOriginsInEachPartition: a record's
// origin is unique within its partition, in every partition a rotation
// starts, and only there.
func TestPartitionedTableSkipsDuplicateOriginsInEachPartition(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testenv.Postgres(t)
	s := partitionedStore(t, db)
	for range 2 {
		require.NoError(t, s.Rotate(ctx))
		rec := []recordstore.Record{{Topic: "orders", UUID: "u", Payload: []byte("{}"), Origin: "consumed-1/0"}}
		require.NoError(t, s.Insert(ctx, rec))
		again := []recordstore.Record{{Topic: "orders", UUID: "u2", Payload: []byte("{}"), Origin: "consumed-1/0"}}
		require.NoError(t, s.Insert(ctx, again))
		assert.Equal(t, rec[0].ID, again[0].ID, "the saved record is returned for its origin")
		_, err := db.ExecContext(ctx, "UPDATE "+s.Table()+" SET origin = NULL")
		require.NoError(t, err)
	}
	// The price, documented: the same origin saved again after a rotation
	// is a second record.
	before := []recordstore.Record{{Topic: "orders", UUID: "v", Payload: []byte("{}"), Origin: "consumed-2/0"}}
	require.NoError(t, s.Insert(ctx, before))
	require.NoError(t, s.Rotate(ctx))
	after := []recordstore.Record{{Topic: "orders", UUID: "v", Payload: []byte("{}"), Origin: "consumed-2/0"}}
	require.NoError(t, s.Insert(ctx, after))
	assert.NotEqual(t, before[0].ID, after[0].ID)
}

// TestPartitionEveryNeedsAPartitionedTable: a partitioned store refuses a
// table of one piece; a store without PartitionEvery (an operator's tool)
// works on a partitioned table.
func TestPartitionEveryNeedsAPartitionedTable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testenv.Postgres(t)
	plain := testenv.NewStore(t, testenv.Backends()[0], db, sqlstore.Mark)
	asPartitioned, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres(), Table: plain.Table(), Completion: sqlstore.Mark, DB: db, PartitionEvery: time.Hour})
	require.NoError(t, err)
	assert.ErrorIs(t, asPartitioned.Verify(ctx), sqlstore.ErrSchemaVersion)
	assert.ErrorIs(t, asPartitioned.Migrate(ctx), sqlstore.ErrSchemaVersion)

	partitioned := partitionedStore(t, db)
	require.NoError(t, partitioned.Verify(ctx))
	asPlain, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres(), Table: partitioned.Table(), Completion: sqlstore.Mark, DB: db})
	require.NoError(t, err)
	require.NoError(t, asPlain.Verify(ctx))
	recs := ordersOf(2, "a")
	require.NoError(t, asPlain.Insert(ctx, recs))
	complete(t, asPlain, recs...)
	completedLongAgo(t, db, asPlain)
	n, err := asPlain.Clean(ctx, time.Hour, 10)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "deleted one by one")
	assert.Equal(t, []string{partitioned.Table() + "_p0"}, partitionNames(t, db, partitioned))
}

// TestPartitionedStoreContract runs the whole store suite on PostgreSQL
// with every marking table partitioned.
func TestPartitionedStoreContract(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[0]
	storetest.Run(t, b.Features, func(t *testing.T, cfg sqlstore.Config) *sqlstore.Store {
		db := b.Open(t)
		cfg.Dialect, cfg.DB = b.Dialect, db
		if cfg.Completion == sqlstore.Mark {
			cfg.PartitionEvery = time.Hour
		}
		s, err := sqlstore.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, cfg.Table) })
		return s
	})
}

// TestPartitionedTableFinishesARoundCutShort: a round killed between
// creating a partition and attaching it, or between detaching one and
// dropping it, leaves a table that the next round attaches or drops.
func TestPartitionedTableFinishesARoundCutShort(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testenv.Postgres(t)
	s := partitionedStore(t, db)
	recs := ordersOf(2, "a")
	require.NoError(t, s.Insert(ctx, recs))
	_, err := db.ExecContext(ctx, "CREATE TABLE "+s.Table()+"_p1 (LIKE "+s.Table()+" INCLUDING DEFAULTS)")
	require.NoError(t, err)
	require.NoError(t, s.Rotate(ctx), "the partition created before is attached")
	later := ordersOf(1, "b")
	require.NoError(t, s.Insert(ctx, later))
	assert.Equal(t, span, later[0].ID)

	complete(t, s, recs...)
	completedLongAgo(t, db, s)
	_, err = db.ExecContext(ctx, "ALTER TABLE "+s.Table()+" DETACH PARTITION "+s.Table()+"_p0")
	require.NoError(t, err)
	n, err := s.Clean(ctx, time.Hour, 10)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the detached partition is dropped")
	assert.Equal(t, []string{s.Table() + "_p1"}, partitionNames(t, db, s))

	// A round cut short after detaching a partition that a late record
	// keeps: the next round attaches it again, and the record is pending.
	require.NoError(t, s.Rotate(ctx))
	_, err = db.ExecContext(ctx, "ALTER TABLE "+s.Table()+" DETACH PARTITION "+s.Table()+"_p1")
	require.NoError(t, err)
	_, err = s.Clean(ctx, time.Hour, 10)
	require.NoError(t, err)
	pending, err := s.PendingAfter(ctx, "orders", 0, 10)
	require.NoError(t, err)
	require.Len(t, pending, 1, "the detached partition's pending record is back")
	assert.Equal(t, later[0].ID, pending[0].ID)
}
