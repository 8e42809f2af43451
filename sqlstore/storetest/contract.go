package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

// Contract describes a store to [RunContract].
type Contract struct {
	// New returns an empty store, ready for use, configured as opts says,
	// and cleans it up when the test ends. Required.
	New func(t *testing.T, opts StoreOptions) recordstore.Store
	// Inspector reads and changes what the store holds behind the
	// recordstore interfaces. Required.
	Inspector Inspector
	// Modes are the completion modes the store supports; the tests of
	// another mode are skipped. Defaults to both.
	Modes []Completion
}

// Completion is what a store does with a record once it is complete; it
// is [recordstore.Completion].
type Completion = recordstore.Completion

const (
	// Mark keeps the record, marked completed.
	Mark = recordstore.Mark
	// Delete removes the record and its deliveries.
	Delete = recordstore.Delete
)

// modeName is the subtest name of a completion mode.
func modeName(c Completion) string {
	if c == Mark {
		return "Mark"
	}
	return "Delete"
}

// StoreOptions say what a contract test needs of the store [Contract.New]
// returns.
type StoreOptions struct {
	// Completion is what the store does with a completed record.
	Completion Completion
	// Lease is the delivery lease (see [recordstore.Releaser]); zero for
	// none.
	Lease time.Duration
}

// Moment names one of the times a store keeps for a record, for
// [Inspector.Backdate].
type Moment int

const (
	// SavedAt is when the record was saved.
	SavedAt Moment = iota
	// SentAt is when the record was last sent (by a claim or a stamp).
	SentAt
	// DueAt is when a failed delivery is due again: the record's, and
	// that of each of its deliveries.
	DueAt
	// CompletedAt is when the record was completed.
	CompletedAt
)

// LongAgo is the time [Inspector.Backdate] moves a record's times to: more
// than 20 years before any test runs.
var LongAgo = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// State is where a record or a delivery is in its life; it is
// [recordstore.State].
type State = recordstore.State

// The states of a record or a delivery.
const (
	Pending   = recordstore.Pending
	Completed = recordstore.Completed
	Abandoned = recordstore.Abandoned
)

// Stored is what a store holds of a record besides the record itself.
type Stored struct {
	State     State
	Attempts  int
	LastError string
	// CompletedAt is the time the store stamped when the record stopped
	// being pending; zero when it has not stamped one.
	CompletedAt time.Time
}

// StoredDelivery is what a store holds of one consumer's delivery of a
// record.
type StoredDelivery struct {
	Consumer  string
	State     State
	Attempts  int
	LastError string
}

// Inspector reads and changes a store's records behind the recordstore
// interfaces, for what those cannot tell: that ids are the ones held, that
// a completed record is kept or gone, that a failure's text is kept; and
// it moves a record's times into the past, so that the suite need not wait.
// Its methods fail the test on error.
type Inspector interface {
	// IDs returns the id of every record the store holds, in any state,
	// by UUID.
	IDs(t testing.TB, store recordstore.Store) map[string]int64
	// Record returns what the store holds of record id, and false when it
	// holds no such record (never saved, deleted or cleaned).
	Record(t testing.TB, store recordstore.Store, id int64) (Stored, bool)
	// Deliveries returns the deliveries the store holds for record id, in
	// consumer order, even when the record itself is gone.
	Deliveries(t testing.TB, store recordstore.Store, id int64) []StoredDelivery
	// Remove deletes record id and its deliveries outright, as an operator
	// would by hand.
	Remove(t testing.TB, store recordstore.Store, id int64)
	// Backdate sets a time of the records (of every record when ids is
	// empty) to [LongAgo].
	Backdate(t testing.TB, store recordstore.Store, m Moment, ids ...int64)
	// Now reads the store's clock: the one its completion stamps, leases
	// and ages use.
	Now(t testing.TB, store recordstore.Store) time.Time
}

// RunContract runs the tests of what every [recordstore.Store] must do, as
// the recordstore package documents it, each on a fresh store, in
// parallel. The tests of an optional interface (a [recordstore.Releaser],
// [recordstore.FailureRecorder], ...) run when the store implements it and
// are skipped, saying which interface is missing, when it does not. The
// transaction interfaces ([recordstore.TxInserter],
// [recordstore.TxCompleter]) need a database and are tested by [Run].
func RunContract(t *testing.T, c Contract) {
	require.NotNil(t, c.New, "Contract.New is required")
	require.NotNil(t, c.Inspector, "Contract.Inspector is required")
	if len(c.Modes) == 0 {
		c.Modes = []Completion{Mark, Delete}
	}
	s := &contract{Contract: c, in: c.Inspector}
	t.Run("Insert", s.testInsert)
	t.Run("Origin", s.testOrigin)
	t.Run("CheckPending", s.testCheckPending)
	t.Run("Complete", s.testComplete)
	t.Run("Message", s.testMessage)
	t.Run("PendingAfter", s.testPendingAfter)
	t.Run("RoundTrip", s.testRoundTrip)
	t.Run("Lease", s.testLease)
	t.Run("Attempts", s.testAttempts)
	t.Run("ClaimStale", s.testClaimStale)
	t.Run("Clean", s.testClean)
	t.Run("Status", s.testStatus)
	t.Run("Identity", s.testIdentity)
	t.Run("Topic", s.testTopic)
	t.Run("OneReceiver", s.testOneReceiver)
	t.Run("Consumers", s.testConsumers)
	t.Run("ConsumerLease", s.testConsumerLease)
	t.Run("ConsumerAttempts", s.testConsumerAttempts)
	t.Run("Retry", s.testRetry)
	t.Run("ConsumerStatus", s.testConsumerStatus)
	t.Run("DeclaredConsumers", s.testDeclaredConsumers)
	t.Run("Retire", s.testRetire)
	t.Run("Declarations", s.testDeclarations)
	t.Run("ConsumersSeen", s.testConsumersSeen)
	t.Run("Order", s.testOrder)
}

type contract struct {
	Contract
	in Inspector
}

// supports reports whether the store supports the completion mode.
func (s *contract) supports(mode Completion) bool {
	for _, m := range s.Modes {
		if m == mode {
			return true
		}
	}
	return false
}

// forEachMode runs fn as a parallel subtest per completion mode.
func (s *contract) forEachMode(t *testing.T, fn func(t *testing.T, mode Completion)) {
	for _, mode := range []Completion{Mark, Delete} {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			s.skipUnless(t, mode)
			fn(t, mode)
		})
	}
}

// skipUnless skips the test when the store does not support the mode.
func (s *contract) skipUnless(t *testing.T, mode Completion) {
	t.Helper()
	if !s.supports(mode) {
		t.Skipf("the store does not support completion mode %v (Contract.Modes)", mode)
	}
}

// store returns a fresh store in the mode.
func (s *contract) store(t *testing.T, mode Completion) recordstore.Store {
	t.Helper()
	s.skipUnless(t, mode)
	store := s.New(t, StoreOptions{Completion: mode})
	require.NotNil(t, store, "Contract.New returned nil")
	return store
}

// leased returns a fresh store in the mode with a delivery lease, skipping
// the test when the store has none.
func (s *contract) leased(t *testing.T, mode Completion, lease time.Duration) (recordstore.Store, recordstore.Releaser) {
	t.Helper()
	s.skipUnless(t, mode)
	store := s.New(t, StoreOptions{Completion: mode, Lease: lease})
	return store, need[recordstore.Releaser](t, store)
}

// need returns the store as the optional interface T, and skips the test
// when the store does not implement it.
func need[T any](t testing.TB, store recordstore.Store) T {
	t.Helper()
	v, ok := store.(T)
	if !ok {
		t.Skipf("the store does not implement %v", reflect.TypeFor[T]())
	}
	return v
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// records builds n records of the topic with distinct UUIDs.
func records(topic string, n int) []recordstore.Record {
	out := make([]recordstore.Record, n)
	for i := range out {
		var b [8]byte
		_, _ = rand.Read(b[:])
		u := hex.EncodeToString(b[:])
		out[i] = recordstore.Record{Topic: topic, UUID: u, Payload: []byte("payload " + u), Metadata: map[string]string{"n": fmt.Sprint(i)}}
	}
	return out
}

// insert saves records in one call and returns them with their ids.
func insert(t testing.TB, store recordstore.Store, recs []recordstore.Record) []recordstore.Record {
	t.Helper()
	require.NoError(t, store.Insert(ctx(t), recs))
	return recs
}

// rowCount is how many records the store holds, in any state.
func (s *contract) rowCount(t testing.TB, store recordstore.Store) int {
	t.Helper()
	return len(s.in.IDs(t, store))
}

// completedAt is the completion stamp of a store that keeps completed
// records, or "deleted" when the record is gone (a deleting store).
func (s *contract) completedAt(t testing.TB, store recordstore.Store, mode Completion, id int64) string {
	t.Helper()
	st, found := s.in.Record(t, store, id)
	if mode == Delete {
		require.False(t, found, "a deleting store holds no completed record %d", id)
		return "deleted"
	}
	require.True(t, found, "a marking store keeps record %d", id)
	require.False(t, st.CompletedAt.IsZero(), "record %d has a completion stamp", id)
	return st.CompletedAt.Format(time.RFC3339Nano)
}

// consumer is the handler name the tests of records without consumers
// complete them as.
const consumer = "handler"

// dlv is the delivery of record id of topic "orders" to consumer.
func dlv(id int64) recordstore.Delivery {
	return recordstore.Delivery{ID: id, Topic: "orders", Consumer: consumer}
}

// consumerDlv is the delivery of record id of topic "orders" to consumer c.
func consumerDlv(id int64, c string) recordstore.Delivery {
	return recordstore.Delivery{ID: id, Topic: "orders", Consumer: c}
}

// withLease is d with a lease token of its own.
func withLease(d recordstore.Delivery, token string) recordstore.Delivery {
	d.Lease = token
	return d
}

// notStored is what CheckPending reports for an id the store does not
// hold: a marking store keeps completed records, so the record is unknown;
// a deleting store cannot tell it from a completed one.
func notStored(mode Completion) error {
	if mode == Mark {
		return recordstore.ErrUnknownRecord
	}
	return recordstore.ErrNotPending
}

func claimedIDs(recs []recordstore.Record) []int64 {
	ids := make([]int64, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ids
}

// neverID is an id no test store reaches.
const neverID = int64(1) << 60

// untilDue is how long the tests make a failed delivery wait.
const untilDue = time.Hour
