package sqlstore_test

import (
	"context"
	"fmt"
	"sync"
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

// coalescing is what one coalescing test needs on one database.
type coalescing struct {
	backend testenv.Backend
	db      *sqlx.DB
	store   *sqlstore.Store
	// statements counts what is sent to PostgreSQL; nil on SQLite.
	statements *testenv.StatementCounter
}

// oneInFlight makes batches form behind a single statement, which the tests
// stall in the database: no insert runs alone beyond it.
var oneInFlight = sqlstore.Coalescing{MaxInFlight: 1, InsertsAloneBelow: -1}

func setupCoalescing(t *testing.T, b testenv.Backend, mode sqlstore.Completion, co sqlstore.Coalescing) *coalescing {
	t.Helper()
	if b.Name == "MariaDB" {
		// These tests hold the table's write lock and count statements, which
		// they do for PostgreSQL and SQLite. MariaDB combines inserts through
		// the same coalescer (every MariaDB suite runs with it on) and has no
		// combined completion (no UPDATE … RETURNING).
		t.Skip("coalescer internals are tested on PostgreSQL and SQLite")
	}
	c := &coalescing{backend: b}
	if b.Name == "Postgres" {
		c.db, c.statements = testenv.CountingPostgres(t)
	} else {
		c.db = b.Open(t)
	}
	table := testenv.Table(t)
	var err error
	c.store, err = sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: mode, DB: c.db, Coalescing: co})
	require.NoError(t, err)
	require.NoError(t, c.store.Migrate(testCtx(t)))
	t.Cleanup(func() { testenv.DropTable(t, c.db, b.Dialect, table) })
	return c
}

// blockWrites holds the table's write lock on a connection of its own, so
// that the store's next write waits in the database while later calls queue
// behind it. The returned function releases the lock.
func (c *coalescing) blockWrites(t *testing.T) (release func()) {
	t.Helper()
	return c.lockTable(t, "EXCLUSIVE")
}

// blockReads holds the table's lock on PostgreSQL in a mode that blocks
// reads too, so that the store's next check waits in the database.
func (c *coalescing) blockReads(t *testing.T) (release func()) {
	t.Helper()
	return c.lockTable(t, "ACCESS EXCLUSIVE")
}

// lockTable holds the table's lock, in mode on PostgreSQL, and SQLite's
// write lock elsewhere.
func (c *coalescing) lockTable(t *testing.T, mode string) (release func()) {
	t.Helper()
	ctx := testCtx(t)
	conn, err := c.db.Connx(ctx)
	require.NoError(t, err)
	if c.backend.Name == "Postgres" {
		_, err = conn.ExecContext(ctx, "BEGIN")
		require.NoError(t, err)
		_, err = conn.ExecContext(ctx, "LOCK TABLE "+c.store.Table()+" IN "+mode+" MODE")
	} else {
		_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	}
	require.NoError(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, err := conn.ExecContext(context.Background(), "ROLLBACK")
			assert.NoError(t, err)
			assert.NoError(t, conn.Close())
		})
	}
	t.Cleanup(release)
	return release
}

// countStatements is how many statements starting with prefix PostgreSQL
// received, or -1 on SQLite, which has no tracer.
func (c *coalescing) countStatements(prefix string) int {
	if c.statements == nil {
		return -1
	}
	return c.statements.Count(prefix)
}

// rowIDs maps each row's uuid to its id.
func (c *coalescing) rowIDs(t *testing.T) map[string]int64 {
	t.Helper()
	var rows []struct {
		ID   int64  `db:"id"`
		UUID string `db:"uuid"`
	}
	require.NoError(t, c.db.SelectContext(testCtx(t), &rows, "SELECT id, uuid FROM "+c.store.Table()))
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.UUID] = r.ID
	}
	return out
}

func records(uuids ...string) []recordstore.Record {
	out := make([]recordstore.Record, len(uuids))
	for i, u := range uuids {
		out[i] = recordstore.Record{Topic: "orders", UUID: u, Payload: []byte(u), Metadata: message.Metadata{"k": u}}
	}
	return out
}

// insertAsync runs Insert on its own goroutine and returns its outcome.
func insertAsync(ctx context.Context, s *sqlstore.Store, recs []recordstore.Record) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Insert(ctx, recs) }()
	return done
}

func completeAsync(ctx context.Context, s *sqlstore.Store, id int64) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Complete(ctx, delivery(id)) }()
	return done
}

// delivery is the delivery of record id of "orders" to one handler.
func delivery(id int64) recordstore.Delivery {
	return recordstore.Delivery{ID: id, Topic: "orders", Consumer: "handler"}
}

// stalledInsert is a store whose first insert waits in the database, so that
// the calls made after it queue behind it.
type stalledInsert struct {
	*coalescing
	ctx     context.Context
	watch   *sqlstore.QueueWatch
	release func()
	first   <-chan error
}

func stallInserts(t *testing.T, c *coalescing) *stalledInsert {
	t.Helper()
	s := &stalledInsert{coalescing: c, ctx: testCtx(t), watch: sqlstore.WatchInserts(c.store)}
	s.release = c.blockWrites(t)
	s.first = insertAsync(s.ctx, c.store, records("first"))
	require.NoError(t, s.watch.Wait(s.ctx, 1, 0))
	return s
}

func TestCoalescing(t *testing.T) {
	t.Parallel()

	t.Run("WaitingInsertsGoAsOneStatement", func(t *testing.T) {
		t.Parallel()
		testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			c := setupCoalescing(t, backend, sqlstore.Mark, oneInFlight)
			before := c.countStatements("INSERT")
			s := stallInserts(t, c)
			ctx, watch := s.ctx, s.watch
			calls := make([][]recordstore.Record, 5)
			dones := make([]<-chan error, len(calls))
			for i := range calls {
				calls[i] = records(fmt.Sprintf("c%d-a", i), fmt.Sprintf("c%d-b", i), fmt.Sprintf("c%d-c", i))
				dones[i] = insertAsync(ctx, c.store, calls[i])
			}
			require.NoError(t, watch.Wait(ctx, 1, len(calls)))
			s.release()

			require.NoError(t, <-s.first)
			for _, d := range dones {
				require.NoError(t, <-d)
			}
			require.NoError(t, watch.Wait(ctx, 0, 0))
			rows := c.rowIDs(t)
			require.Len(t, rows, 1+3*len(calls))
			seen := map[int64]bool{}
			for _, call := range calls {
				for j, r := range call {
					assert.Equal(t, rows[r.UUID], r.ID, "record %s carries the id of its own row", r.UUID)
					assert.False(t, seen[r.ID], "id %d given twice", r.ID)
					seen[r.ID] = true
					if j > 0 {
						assert.Greater(t, r.ID, call[j-1].ID, "one call's records keep their order")
					}
				}
			}
			if c.statements != nil {
				assert.Equal(t, 2, c.countStatements("INSERT")-before,
					"the insert in flight, then one statement for the five calls that waited")
			}
		})
	})

	t.Run("MaxBatchSplitsWaitingCalls", func(t *testing.T) {
		t.Parallel()
		c := setupCoalescing(t, testenv.Backends()[0], sqlstore.Mark, sqlstore.Coalescing{MaxBatch: 6, MaxInFlight: 1, InsertsAloneBelow: -1})
		require.NotNil(t, c.statements, "the first backend is PostgreSQL, whose statements are counted")
		ctx := testCtx(t)
		before := c.statements.Count("INSERT")
		s := stallInserts(t, c)
		store, statements := c.store, c.statements
		var dones []<-chan error
		for i := range 3 {
			dones = append(dones, insertAsync(ctx, store, records(fmt.Sprintf("c%d-a", i), fmt.Sprintf("c%d-b", i), fmt.Sprintf("c%d-c", i))))
			require.NoError(t, s.watch.Wait(ctx, 1, i+1))
		}
		s.release()
		require.NoError(t, <-s.first)
		for _, d := range dones {
			require.NoError(t, <-d)
		}
		assert.Equal(t, 3, statements.Count("INSERT")-before,
			"the first insert, then two waiting calls of three records (six, the cap), then the third")
		assert.Len(t, s.rowIDs(t), 10)
	})

	t.Run("SecondStatementRunsWhileFirstWaits", func(t *testing.T) {
		t.Parallel()
		testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			c := setupCoalescing(t, backend, sqlstore.Mark, sqlstore.Coalescing{MaxInFlight: 2, InsertsAloneBelow: -1})
			before := c.countStatements("INSERT")
			s := stallInserts(t, c)
			ctx := s.ctx
			second := insertAsync(ctx, c.store, records("second"))
			require.NoError(t, s.watch.Wait(ctx, 2, 0), "the second call does not wait for the first")
			dones := []<-chan error{insertAsync(ctx, c.store, records("w1")), insertAsync(ctx, c.store, records("w2"))}
			require.NoError(t, s.watch.Wait(ctx, 2, 2), "the third and fourth wait for a statement to return")
			s.release()
			for _, d := range append(dones, s.first, second) {
				require.NoError(t, <-d)
			}
			assert.Len(t, c.rowIDs(t), 4)
			if c.statements != nil {
				assert.Equal(t, 3, c.countStatements("INSERT")-before, "first, second, then the two that waited together")
			}
		})
	})

	// A few publishers: an insert that finds another in flight goes at
	// once, alone, instead of waiting for it, until InsertsAloneBelow
	// calls are being inserted.
	t.Run("FewCallersInsertAlone", func(t *testing.T) {
		t.Parallel()
		testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			c := setupCoalescing(t, backend, sqlstore.Mark, sqlstore.Coalescing{MaxInFlight: 1, InsertsAloneBelow: 4})
			before := c.countStatements("INSERT")
			s := stallInserts(t, c)
			ctx := s.ctx
			var dones []<-chan error
			for i := range 3 {
				dones = append(dones, insertAsync(ctx, c.store, records(fmt.Sprintf("alone-%d", i))))
				require.NoError(t, s.watch.Wait(ctx, 2+i, 0), "call %d runs alone beside the stalled one", i+2)
			}
			dones = append(dones, insertAsync(ctx, c.store, records("fifth")), insertAsync(ctx, c.store, records("sixth")))
			require.NoError(t, s.watch.Wait(ctx, 4, 2), "with four calls being inserted, the fifth and sixth wait")
			s.release()
			for _, d := range append(dones, s.first) {
				require.NoError(t, <-d)
			}
			require.NoError(t, s.watch.Wait(ctx, 0, 0))
			assert.Len(t, c.rowIDs(t), 6)
			if c.statements != nil {
				assert.Equal(t, 5, c.countStatements("INSERT")-before, "four alone, then the two that waited together")
			}
			// The slots beyond MaxInFlight are given up as their inserts
			// return; the waiting calls leave with the last one, so that
			// combined inserts never run more than MaxInFlight at once.
			history := s.watch.History()
			for i := 1; i < len(history); i++ {
				if history[i-1][1] == 2 && history[i][1] == 0 {
					assert.Equal(t, [2]int{1, 0}, history[i], "the waiting calls left with the last slot: %v", history)
				}
			}
		})
	})

	// Many publishers: once a call found more than InsertsAloneBelow calls
	// being inserted, waiting or arriving, an insert that finds another in
	// flight waits and combines, even while few calls are being inserted.
	t.Run("AfterManyCallersInsertsCombineAgain", func(t *testing.T) {
		t.Parallel()
		testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			c := setupCoalescing(t, backend, sqlstore.Mark, sqlstore.Coalescing{MaxInFlight: 1, InsertsAloneBelow: 2})
			s := stallInserts(t, c)
			ctx := s.ctx
			second := insertAsync(ctx, c.store, records("alone"))
			require.NoError(t, s.watch.Wait(ctx, 2, 0), "the second call runs alone")
			waiting := []<-chan error{insertAsync(ctx, c.store, records("w1")), insertAsync(ctx, c.store, records("w2"))}
			require.NoError(t, s.watch.Wait(ctx, 2, 2))
			s.release()
			for _, d := range append(waiting, s.first, second) {
				require.NoError(t, <-d)
			}
			require.NoError(t, s.watch.Wait(ctx, 0, 0), "the extra slot was given up, the last one took the two waiting calls")

			// The third call found three calls: the next call that finds
			// an insert in flight waits for it.
			s2 := stallInserts(t, c)
			late := insertAsync(ctx, c.store, records("late"))
			require.NoError(t, s2.watch.Wait(ctx, 1, 1), "it waits, although only one call is being inserted")
			s2.release()
			require.NoError(t, <-s2.first)
			require.NoError(t, <-late)
			var rows int
			require.NoError(t, c.db.GetContext(ctx, &rows, "SELECT COUNT(*) FROM "+c.store.Table()))
			assert.Equal(t, 6, rows)
		})
	})

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		for _, d := range []*sqlstore.Dialect{sqlstore.Postgres(), sqlstore.SQLite(), sqlstore.MySQL()} {
			s, err := sqlstore.New(sqlstore.Config{Dialect: d})
			require.NoError(t, err)
			assert.Equal(t, sqlstore.Coalescing{MaxBatch: 1000, MaxInFlight: 1}, s.Coalescing(), d.Name())
		}
		s, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres(), Coalescing: sqlstore.Coalescing{InsertsAloneBelow: -1}})
		require.NoError(t, err)
		assert.Equal(t, -1, s.Coalescing().InsertsAloneBelow, "a negative value turns it off")
		_, err = sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres(), Coalescing: sqlstore.Coalescing{MaxBatch: 10, InsertsAloneBelow: 11}})
		assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
	})

	t.Run("RefusedRecordFailsOnlyItsOwnCall", func(t *testing.T) {
		t.Parallel()
		testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			c := setupCoalescing(t, backend, sqlstore.Mark, oneInFlight)
			ctx := testCtx(t)
			table := c.store.Table()
			// The database, not the code, refuses one record.
			if backend.Name == "Postgres" {
				_, err := c.db.ExecContext(ctx, "ALTER TABLE "+table+" ADD CONSTRAINT "+table+"_no_poison CHECK (uuid <> 'poison')")
				require.NoError(t, err)
			} else {
				_, err := c.db.ExecContext(ctx, "CREATE TRIGGER "+table+"_no_poison BEFORE INSERT ON "+table+
					" WHEN NEW.uuid = 'poison' BEGIN SELECT RAISE(ABORT, 'poison refused'); END")
				require.NoError(t, err)
			}
			s := stallInserts(t, c)
			good1, bad, good2 := records("good-1a", "good-1b"), records("ok-before", "poison"), records("good-2")
			dones := []<-chan error{insertAsync(ctx, c.store, good1), insertAsync(ctx, c.store, bad), insertAsync(ctx, c.store, good2)}
			require.NoError(t, s.watch.Wait(ctx, 1, 3))
			s.release()

			require.NoError(t, <-s.first)
			require.NoError(t, <-dones[0])
			badErr := <-dones[1]
			var tableErr *sqlstore.TableError
			require.ErrorAs(t, badErr, &tableErr, "the refused call gets the database's error")
			assert.Equal(t, table, tableErr.Table)
			require.NoError(t, <-dones[2])

			rows := c.rowIDs(t)
			assert.Len(t, rows, 4)
			for _, r := range append(append(records("first"), good1...), good2...) {
				assert.Contains(t, rows, r.UUID)
			}
			assert.NotContains(t, rows, "ok-before", "a refused call saves none of its records")
			for _, r := range append(good1, good2...) {
				assert.Equal(t, rows[r.UUID], r.ID)
			}
		})
	})

	t.Run("InvalidMetadataFailsOnlyItsOwnCall", func(t *testing.T) {
		t.Parallel()
		testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			s := stallInserts(t, setupCoalescing(t, backend, sqlstore.Mark, oneInFlight))
			ctx, c := s.ctx, s.coalescing
			bad := records("bad")
			bad[0].Metadata = message.Metadata{"k": "\xff"}
			good := records("good")
			dones := []<-chan error{insertAsync(ctx, c.store, bad), insertAsync(ctx, c.store, good)}
			require.NoError(t, s.watch.Wait(ctx, 1, 2))
			s.release()

			require.NoError(t, <-s.first)
			assert.ErrorIs(t, <-dones[0], sqlstore.ErrInvalidRecord)
			require.NoError(t, <-dones[1])
			rows := c.rowIDs(t)
			assert.Equal(t, map[string]int64{"first": rows["first"], "good": good[0].ID}, rows)
		})
	})

	t.Run("FailedStatementFailsExactlyItsCalls", func(t *testing.T) {
		t.Parallel()
		testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			s := stallInserts(t, setupCoalescing(t, backend, sqlstore.Mark, oneInFlight))
			ctx, c := s.ctx, s.coalescing
			dones := []<-chan error{insertAsync(ctx, c.store, records("lost-1")), insertAsync(ctx, c.store, records("lost-2"))}
			require.NoError(t, s.watch.Wait(ctx, 1, 2))
			// The waiting calls' statement will run on a pool that is gone,
			// the one in flight finishes on its own.
			closed := backend.Open(t)
			require.NoError(t, closed.Close())
			c.store.Attach(closed)
			s.release()

			require.NoError(t, <-s.first, "the statement in flight is not affected")
			for _, d := range dones {
				err := <-d
				require.Error(t, err)
				assert.Contains(t, err.Error(), "database is closed")
			}
			c.store.Attach(c.db)
			require.NoError(t, c.store.Insert(ctx, records("after")), "later calls are not affected")
			rows := c.rowIDs(t)
			assert.Len(t, rows, 2)
			assert.Contains(t, rows, "first")
			assert.Contains(t, rows, "after")
		})
	})

	t.Run("CancelledWaitingCallLeavesTheQueue", func(t *testing.T) {
		t.Parallel()
		testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			s := stallInserts(t, setupCoalescing(t, backend, sqlstore.Mark, oneInFlight))
			ctx, c, watch := s.ctx, s.coalescing, s.watch
			gaveUp, cancel := context.WithCancel(ctx)
			cancelledDone := insertAsync(gaveUp, c.store, records("gave-up"))
			require.NoError(t, watch.Wait(ctx, 1, 1))
			keptDone := insertAsync(ctx, c.store, records("kept"))
			require.NoError(t, watch.Wait(ctx, 1, 2))
			cancel()
			require.ErrorIs(t, <-cancelledDone, context.Canceled)
			require.NoError(t, watch.Wait(ctx, 1, 1))
			s.release()

			require.NoError(t, <-s.first)
			require.NoError(t, <-keptDone)
			rows := c.rowIDs(t)
			assert.Len(t, rows, 2)
			assert.NotContains(t, rows, "gave-up")
		})
	})

	for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
		t.Run("CompletionsReportNotPendingPerID/"+mode.String(), func(t *testing.T) {
			t.Parallel()
			testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
				c := setupCoalescing(t, backend, mode, oneInFlight)
				ctx := testCtx(t)
				recs := records("r1", "r2", "r3", "r4")
				require.NoError(t, c.store.Insert(ctx, recs))
				r1, r2, r3, r4 := recs[0].ID, recs[1].ID, recs[2].ID, recs[3].ID
				require.NoError(t, c.store.Complete(ctx, delivery(r2)))
				watch := sqlstore.WatchCompletes(c.store)
				release := c.blockWrites(t)
				// The completions of the record table; a call the combined
				// statement did not complete then tries the record's
				// per-consumer deliveries, which this does not count.
				verbs := map[sqlstore.Completion][]string{
					sqlstore.Mark:   {`UPDATE "` + c.store.Table() + `" SET processed_at`, `UPDATE "` + c.store.Table() + `" AS r SET processed_at`},
					sqlstore.Delete: {`DELETE FROM "` + c.store.Table() + `"`},
				}[mode]
				count := func() int {
					n := 0
					for _, v := range verbs {
						n += c.countStatements(v)
					}
					return n
				}
				before := count()

				firstDone := completeAsync(ctx, c.store, r1)
				require.NoError(t, watch.Wait(ctx, 1, 0))
				ids := []int64{r3, r2, r4 + 1000, r3, r4}
				dones := make([]<-chan error, len(ids))
				for i, id := range ids {
					dones[i] = completeAsync(ctx, c.store, id)
				}
				require.NoError(t, watch.Wait(ctx, 1, len(ids)))
				release()

				require.NoError(t, <-firstDone)
				errs := make([]error, len(ids))
				for i, d := range dones {
					errs[i] = <-d
				}
				r3Errs := []error{errs[0], errs[3]}
				assert.Equal(t, 1, countNil(r3Errs), "one of two calls for the same pending record completes it: %v", r3Errs)
				for _, err := range r3Errs {
					if err != nil {
						assert.ErrorIs(t, err, outbox.ErrNotPending)
					}
				}
				assert.ErrorIs(t, errs[1], outbox.ErrNotPending, "already completed")
				assert.ErrorIs(t, errs[2], outbox.ErrNotPending, "never existed")
				assert.NoError(t, errs[4])
				for _, id := range []int64{r1, r2, r3, r4} {
					assert.ErrorIs(t, c.store.CheckPending(ctx, delivery(id)), outbox.ErrNotPending, "record %d", id)
				}
				if c.statements != nil {
					// The batch skips rows another transaction holds, so a
					// call it did not complete cannot tell a held row from
					// one that is not pending: it completes alone, with a
					// statement that waits for the row.
					assert.Equal(t, 2+3, count()-before,
						"the completion in flight, one statement for the five that waited, and one alone for each of the three it did not complete")
				}
			})
		})
	}

	t.Run("ConcurrentCallersGetTheirOwnIDsInOrder", func(t *testing.T) {
		t.Parallel()
		testenv.ForEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			c := setupCoalescing(t, backend, sqlstore.Mark, oneInFlight)
			ctx := testCtx(t)
			const callers, calls = 16, 25
			got := make([][]recordstore.Record, callers)
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for g := range callers {
				wg.Go(func() {
					for i := range calls {
						recs := records(fmt.Sprintf("g%d-%d-a", g, i), fmt.Sprintf("g%d-%d-b", g, i))
						if err := c.store.Insert(ctx, recs); err != nil {
							errs <- err
							return
						}
						got[g] = append(got[g], recs...)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			rows := c.rowIDs(t)
			require.Len(t, rows, callers*calls*2)
			for g, recs := range got {
				for i, r := range recs {
					require.Equal(t, rows[r.UUID], r.ID, "caller %d record %s", g, r.UUID)
					if i > 0 {
						require.Greater(t, r.ID, recs[i-1].ID, "caller %d's records are saved in the order it sent them", g)
					}
				}
			}
			if c.statements != nil {
				t.Logf("%d records in %d INSERT statements", callers*calls*2, c.countStatements("INSERT"))
			}
		})
	})

	t.Run("ConfigIsValidated", func(t *testing.T) {
		t.Parallel()
		for _, co := range []sqlstore.Coalescing{{MaxBatch: -1}, {MaxInFlight: -2}} {
			_, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), Coalescing: co})
			assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig, "%+v", co)
		}
	})
}

func countNil(errs []error) int {
	n := 0
	for _, err := range errs {
		if err == nil {
			n++
		}
	}
	return n
}
