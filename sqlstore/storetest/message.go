package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

// forged is the UUID of a message that names a record it was not saved
// for; no record of the suite is saved with it.
const forged = "forged-message"

// unkeptUUIDs are message UUIDs with bytes that some databases cannot
// keep: a NUL byte, bytes that are not UTF-8.
var unkeptUUIDs = []string{"forged\x00", "forged\xff", "\x00", "\xc3\x28"}

// of is d naming the message with the UUID.
func of(d recordstore.Delivery, uuid string) recordstore.Delivery {
	d.UUID = uuid
	return d
}

// testMessage: a delivery that names its message ([recordstore.Delivery.UUID])
// acts only on a record saved for that message; one that names none acts
// on the record of its id, as operators' tools do.
func (s *contract) testMessage(t *testing.T) {
	t.Run("CheckPendingOfAnotherMessageIsAMismatch", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, records("orders", 2))
			pending, completed := recs[0], recs[1]
			require.NoError(t, store.Complete(ctx(t), of(dlv(completed.ID), completed.UUID)))

			assert.ErrorIs(t, store.CheckPending(ctx(t), of(dlv(pending.ID), forged)), recordstore.ErrMessageMismatch)
			assert.ErrorIs(t, store.CheckPending(ctx(t), of(dlv(pending.ID), recs[1].UUID)), recordstore.ErrMessageMismatch,
				"another record's message is another message")
			assert.NoError(t, store.CheckPending(ctx(t), of(dlv(pending.ID), pending.UUID)), "still pending for its own message")
			assert.NoError(t, store.CheckPending(ctx(t), dlv(pending.ID)), "and for a delivery that names no message")

			// A marking store compares whatever the state; a deleting one
			// has no row left to compare.
			wantCompleted := recordstore.ErrMessageMismatch
			if mode == Delete {
				wantCompleted = recordstore.ErrNotPending
			}
			assert.ErrorIs(t, store.CheckPending(ctx(t), of(dlv(completed.ID), forged)), wantCompleted, "completed record")
			assert.ErrorIs(t, store.CheckPending(ctx(t), of(recordstore.Delivery{ID: pending.ID, Topic: "payments", Consumer: consumer}, forged)),
				recordstore.ErrUnknownRecord, "another topic's record is unknown, whichever message")
		})
	})

	t.Run("CompleteOfAnotherMessageCompletesNothing", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			r := insert(t, store, records("orders", 1))[0]

			assert.ErrorIs(t, store.Complete(ctx(t), of(dlv(r.ID), forged)), recordstore.ErrNotPending)
			st, found := s.in.Record(t, store, r.ID)
			require.True(t, found, "the record is still held")
			assert.Equal(t, Pending, st.State)
			assert.NoError(t, store.CheckPending(ctx(t), of(dlv(r.ID), r.UUID)), "still pending for its own message")

			require.NoError(t, store.Complete(ctx(t), of(dlv(r.ID), r.UUID)), "its own message completes it")
			s.assertCompleted(t, store, mode, r.ID)
		})
	})

	t.Run("NoMessageNamedActsByID", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			r := insert(t, store, records("orders", 1))[0]
			require.NoError(t, store.CheckPending(ctx(t), dlv(r.ID)))
			require.NoError(t, store.Complete(ctx(t), dlv(r.ID)), "an operator completes a record by its id")
			s.assertCompleted(t, store, mode, r.ID)
		})
	})

	t.Run("WithConsumers", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			r := insert(t, store, withConsumers(1, twoConsumers...))[0]
			billing, shipping := consumerDlv(r.ID, "billing"), consumerDlv(r.ID, "shipping")

			assert.ErrorIs(t, store.CheckPending(ctx(t), of(billing, forged)), recordstore.ErrMessageMismatch)
			assert.ErrorIs(t, store.Complete(ctx(t), of(billing, forged)), recordstore.ErrNotPending)
			for _, d := range s.in.Deliveries(t, store, r.ID) {
				assert.Equal(t, Pending, d.State, "delivery of %q", d.Consumer)
			}

			require.NoError(t, store.CheckPending(ctx(t), of(billing, r.UUID)))
			require.NoError(t, store.Complete(ctx(t), of(billing, r.UUID)))
			assert.ErrorIs(t, store.CheckPending(ctx(t), of(billing, forged)), recordstore.ErrMessageMismatch,
				"a completed delivery of a kept record is compared too")
			require.NoError(t, store.Complete(ctx(t), shipping), "a delivery that names no message completes by id")
			s.assertCompleted(t, store, mode, r.ID)
		})
	})

	t.Run("WithLease", func(t *testing.T) {
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store, _ := s.leased(t, mode, time.Hour)
			one := insert(t, store, records("orders", 1))[0]
			many := insert(t, store, withConsumers(1, twoConsumers...))[0]
			for _, d := range []recordstore.Delivery{dlv(one.ID), consumerDlv(many.ID, "billing")} {
				assert.ErrorIs(t, store.CheckPending(ctx(t), withLease(of(d, forged), "forged")), recordstore.ErrMessageMismatch,
					"record %d for %q", d.ID, d.Consumer)
			}
			require.NoError(t, store.CheckPending(ctx(t), withLease(of(dlv(one.ID), one.UUID), "real")),
				"the mismatch took no lease: the record's own message claims it")
			require.NoError(t, store.CheckPending(ctx(t), withLease(of(consumerDlv(many.ID, "billing"), many.UUID), "real")),
				"nor a delivery's lease")
			assert.ErrorIs(t, store.CheckPending(ctx(t), withLease(of(dlv(one.ID), forged), "forged again")), recordstore.ErrMessageMismatch,
				"a claimed record is compared too")
		})
	})

	t.Run("AUUIDNoRecordCanHaveIsAMismatch", func(t *testing.T) {
		// A UUID with bytes a database may refuse (PostgreSQL's text
		// keeps no NUL byte and no invalid UTF-8) is no record's, with
		// or without a lease: never a failure to retry. A completion
		// naming it completes nothing, refused as a value the store
		// cannot keep or as another message's.
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			for name, lease := range map[string]time.Duration{"NoLease": 0, "Lease": time.Hour} {
				t.Run(name, func(t *testing.T) {
					var store recordstore.Store
					if lease > 0 {
						store, _ = s.leased(t, mode, lease)
					} else {
						store = s.store(t, mode)
					}
					r := insert(t, store, records("orders", 1))[0]
					for _, uuid := range unkeptUUIDs {
						d := withLease(of(dlv(r.ID), uuid), "forged")
						assert.ErrorIs(t, store.CheckPending(ctx(t), d), recordstore.ErrMessageMismatch, "check of %q", uuid)
						if err := store.Complete(ctx(t), d); !errors.Is(err, recordstore.ErrInvalidValue) {
							assert.ErrorIs(t, err, recordstore.ErrNotPending, "completion of %q", uuid)
						}
					}
					require.NoError(t, store.CheckPending(ctx(t), withLease(of(dlv(r.ID), r.UUID), "real")),
						"pending for its own message, which claims it")
					require.NoError(t, store.Complete(ctx(t), of(dlv(r.ID), r.UUID)))
				})
			}
		})
	})

	t.Run("ConcurrentCopiesOfTwoMessages", func(t *testing.T) {
		// Concurrent calls may be combined into one statement (see
		// sqlstore.Coalescing): each call still gets its own message's
		// verdict.
		s.forEachMode(t, func(t *testing.T, mode Completion) {
			store := s.store(t, mode)
			recs := insert(t, store, records("orders", 16))
			type outcome struct{ real, fake error }
			checks, completions := make([]outcome, len(recs)), make([]outcome, len(recs))
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, r := range recs {
				wg.Go(func() {
					<-start
					checks[i].fake = store.CheckPending(ctx(t), of(dlv(r.ID), forged))
					completions[i].fake = store.Complete(ctx(t), of(dlv(r.ID), forged))
				})
				wg.Go(func() {
					<-start
					checks[i].real = store.CheckPending(ctx(t), of(dlv(r.ID), r.UUID))
					if checks[i].real == nil {
						completions[i].real = store.Complete(ctx(t), of(dlv(r.ID), r.UUID))
					}
				})
			}
			close(start)
			wg.Wait()
			for i, r := range recs {
				if mode == Mark || !errors.Is(checks[i].fake, recordstore.ErrNotPending) {
					// A deleting store may have completed the record first.
					assert.ErrorIs(t, checks[i].fake, recordstore.ErrMessageMismatch, "check of the forged copy of record %d", r.ID)
				}
				assert.ErrorIs(t, completions[i].fake, recordstore.ErrNotPending, "completion of the forged copy of record %d", r.ID)
				assert.NoError(t, completions[i].real, "completion of record %d by its own message", r.ID)
				s.assertCompleted(t, store, mode, r.ID)
			}
		})
	})
}
