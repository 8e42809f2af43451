package sqlstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestCheckCoalescing: on PostgreSQL, checks that wait behind a check in
// flight go to the database as one query, and each gets the verdict it
// would get alone. The first check is held in the database by an ACCESS
// EXCLUSIVE lock on the table, which blocks reads.
func TestCheckCoalescing(t *testing.T) {
	t.Parallel()
	for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
		t.Run(map[sqlstore.Completion]string{sqlstore.Mark: "Mark", sqlstore.Delete: "Delete"}[mode], func(t *testing.T) {
			t.Parallel()
			c := setupCoalescing(t, testenv.Backends()[0], mode, oneInFlight)
			ctx := testCtx(t)
			recs := records("pending", "done", "other-topic", "failed")
			recs[2].Topic = "payments"
			withConsumers := recordstore.Record{Topic: "orders", UUID: "fan-out", Payload: []byte("{}"), Consumers: []string{"email", "stats"}}
			recs = append(recs, withConsumers)
			require.NoError(t, c.store.Insert(ctx, recs))
			pending, done, otherTopic, failed, fanOut := recs[0].ID, recs[1].ID, recs[2].ID, recs[3].ID, recs[4].ID
			require.NoError(t, c.store.Complete(ctx, delivery(done)))
			require.NoError(t, c.store.Complete(ctx, recordstore.Delivery{ID: fanOut, Topic: "orders", Consumer: "email"}))
			_, _, err := c.store.RecordFailure(ctx, delivery(failed), "boom", 0, func(int) time.Duration { return time.Hour })
			require.NoError(t, err)

			// Alone, each check is one query of its own.
			cases := []struct {
				name  string
				d     recordstore.Delivery
				check func(t *testing.T, err error)
			}{
				{"pending", delivery(pending), func(t *testing.T, err error) { assert.NoError(t, err) }},
				{"same pending again", delivery(pending), func(t *testing.T, err error) { assert.NoError(t, err) }},
				{"completed", delivery(done), func(t *testing.T, err error) { assert.ErrorIs(t, err, recordstore.ErrNotPending) }},
				{"unknown id", delivery(fanOut + 1000), func(t *testing.T, err error) {
					if mode == sqlstore.Mark {
						assert.ErrorIs(t, err, recordstore.ErrUnknownRecord)
					} else {
						assert.ErrorIs(t, err, recordstore.ErrNotPending, "a deleting table keeps no completed records")
					}
				}},
				{"another topic's record", delivery(otherTopic), func(t *testing.T, err error) { assert.ErrorIs(t, err, recordstore.ErrUnknownRecord) }},
				{"not due", delivery(failed), func(t *testing.T, err error) {
					var notDue *recordstore.NotDueError
					assert.True(t, errors.As(err, &notDue), "got %v", err)
				}},
				{"consumer done", recordstore.Delivery{ID: fanOut, Topic: "orders", Consumer: "email"}, func(t *testing.T, err error) {
					assert.ErrorIs(t, err, recordstore.ErrNotPending)
				}},
				{"consumer pending", recordstore.Delivery{ID: fanOut, Topic: "orders", Consumer: "stats"}, func(t *testing.T, err error) { assert.NoError(t, err) }},
				{"undeclared consumer", recordstore.Delivery{ID: fanOut, Topic: "orders", Consumer: "audit"}, func(t *testing.T, err error) {
					assert.ErrorIs(t, err, recordstore.ErrNoDelivery)
				}},
			}
			for _, tc := range cases {
				tc.check(t, c.store.CheckPending(ctx, tc.d))
			}
			const combined = "SELECT x.id"
			require.Zero(t, c.countStatements(combined), "a check alone runs the single query")

			// Together, behind a check held in the database: one query.
			watch := sqlstore.WatchChecks(c.store)
			require.NotNil(t, watch)
			release := c.blockReads(t)
			first := make(chan error, 1)
			go func() { first <- c.store.CheckPending(ctx, delivery(pending)) }()
			require.NoError(t, watch.Wait(ctx, 1, 0))
			errs := make([]error, len(cases))
			var wg sync.WaitGroup
			for i, tc := range cases {
				wg.Go(func() { errs[i] = c.store.CheckPending(ctx, tc.d) })
			}
			require.NoError(t, watch.Wait(ctx, 1, len(cases)))
			release()
			wg.Wait()
			require.NoError(t, <-first)
			for i, tc := range cases {
				t.Run(tc.name, func(t *testing.T) { tc.check(t, errs[i]) })
			}
			assert.Equal(t, 1, c.countStatements(combined), "the waiting checks went as one query")
		})
	}
}

// TestCheckCoalescingGivesUpWithItsContext: a check whose context ends
// while it waits leaves with the context's error, and the others get their
// verdicts.
func TestCheckCoalescingGivesUpWithItsContext(t *testing.T) {
	t.Parallel()
	c := setupCoalescing(t, testenv.Backends()[0], sqlstore.Mark, oneInFlight)
	ctx := testCtx(t)
	recs := records("a", "b")
	require.NoError(t, c.store.Insert(ctx, recs))
	watch := sqlstore.WatchChecks(c.store)
	release := c.blockReads(t)
	first := make(chan error, 1)
	go func() { first <- c.store.CheckPending(ctx, delivery(recs[0].ID)) }()
	require.NoError(t, watch.Wait(ctx, 1, 0))
	short, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- c.store.CheckPending(short, delivery(recs[1].ID)) }()
	stays := make(chan error, 1)
	go func() { stays <- c.store.CheckPending(ctx, delivery(recs[1].ID)) }()
	require.NoError(t, watch.Wait(ctx, 1, 2))
	cancel()
	assert.ErrorIs(t, <-gaveUp, context.Canceled)
	release()
	require.NoError(t, <-first)
	require.NoError(t, <-stays)
}
