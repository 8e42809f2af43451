package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

// InboxContract describes an inbox to [RunInbox].
type InboxContract struct {
	// New returns an empty inbox, ready for use, and cleans it up when the
	// test ends. Required.
	New func(t *testing.T) recordstore.Inbox
	// Begin begins a transaction that the inbox's MarkHandledTx can join.
	// It is called from other goroutines than the test's too, so it
	// returns its error rather than failing the test. Required.
	Begin func(ctx context.Context, inbox recordstore.Inbox) (recordstore.Tx, error)
	// Age moves the handled time of the consumer's entry for the message
	// to [LongAgo]. Required.
	Age func(t testing.TB, inbox recordstore.Inbox, consumer, messageUUID string)
	// MaxField is the longest Consumer, MessageUUID, BusinessKey and
	// Source, in bytes, that the inbox keeps. Defaults to 0, no limit: the
	// tests of longer fields are skipped.
	MaxField int
}

// RunInbox runs the tests of what every [recordstore.Inbox] must do, as
// the recordstore package documents it, each on a fresh inbox, in
// parallel: entries found by message UUID and business key per consumer,
// duplicates refused with [recordstore.ErrAlreadyHandled], entries saved in
// a transaction that commit or roll back with it, a concurrent transaction
// saving the same entry that waits for the first, cleaning by age in
// bounded batches, and invalid entries refused with
// [recordstore.ErrInvalidEntry], entries with bytes the inbox cannot keep
// too. sqlstore runs it on PostgreSQL,
// MySQL/MariaDB and SQLite, outboxtest on its in-memory inbox.
func RunInbox(t *testing.T, c InboxContract) {
	require.NotNil(t, c.New, "InboxContract.New is required")
	require.NotNil(t, c.Begin, "InboxContract.Begin is required")
	require.NotNil(t, c.Age, "InboxContract.Age is required")
	s := &inboxSuite{c}
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"HandledOnceMarked", s.testHandledOnceMarked},
		{"SecondMarkIsAlreadyHandled", s.testSecondMark},
		{"ConsumersAreIndependent", s.testConsumers},
		{"BusinessKey", s.testBusinessKey},
		{"EmptyBusinessKeysNeverConflict", s.testEmptyBusinessKeys},
		{"HandledAsReturnsTheStoredEntry", s.testHandledAs},
		{"MarkHandledTx", s.testMarkHandledTx},
		{"ConcurrentTransactions", s.testConcurrentTx},
		{"Clean", s.testClean},
		{"InvalidEntries", s.testInvalidEntries},
		{"EntriesOfAnyBytes", s.testAnyBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t)
		})
	}
}

type inboxSuite struct{ InboxContract }

// entry is a fresh entry of the consumer with a message UUID of its own.
func entry(consumer, businessKey string) recordstore.InboxEntry {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return recordstore.InboxEntry{Consumer: consumer, MessageUUID: "msg-" + hex.EncodeToString(b[:]), BusinessKey: businessKey, Source: "orders-service", RecordID: 42}
}

func (s *inboxSuite) inbox(t *testing.T) recordstore.Inbox {
	t.Helper()
	in := s.New(t)
	require.NotNil(t, in, "InboxContract.New returned nil")
	return in
}

func (s *inboxSuite) begin(t *testing.T, in recordstore.Inbox) recordstore.Tx {
	t.Helper()
	tx, err := s.Begin(ctx(t), in)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func handled(t testing.TB, in recordstore.Inbox, e recordstore.InboxEntry) bool {
	t.Helper()
	ok, err := in.Handled(ctx(t), e)
	require.NoError(t, err)
	return ok
}

func (s *inboxSuite) testHandledOnceMarked(t *testing.T) {
	in := s.inbox(t)
	for _, bk := range []string{"", "order-1"} {
		e := entry("billing", bk)
		assert.False(t, handled(t, in, e), "not handled before MarkHandled (business key %q)", bk)
		require.NoError(t, in.MarkHandled(ctx(t), e))
		assert.True(t, handled(t, in, e), "handled once marked (business key %q)", bk)
		otherKey := e
		otherKey.BusinessKey = "order-other"
		assert.True(t, handled(t, in, otherKey), "the message UUID alone finds the entry")
	}
}

func (s *inboxSuite) testSecondMark(t *testing.T) {
	in := s.inbox(t)
	e := entry("billing", "order-1")
	require.NoError(t, in.MarkHandled(ctx(t), e))
	assert.ErrorIs(t, in.MarkHandled(ctx(t), e), recordstore.ErrAlreadyHandled)

	tx := s.begin(t, in)
	assert.ErrorIs(t, in.MarkHandledTx(ctx(t), tx, e), recordstore.ErrAlreadyHandled, "in a transaction too")
	next := entry("billing", "order-2")
	require.NoError(t, in.MarkHandledTx(ctx(t), tx, next), "the transaction is still usable after ErrAlreadyHandled")
	require.NoError(t, tx.Commit())
	assert.True(t, handled(t, in, next))
}

func (s *inboxSuite) testConsumers(t *testing.T) {
	in := s.inbox(t)
	billing := entry("billing", "order-1")
	require.NoError(t, in.MarkHandled(ctx(t), billing))
	shipping := billing
	shipping.Consumer = "shipping"
	assert.False(t, handled(t, in, shipping), "another consumer has not handled the message, nor its business key")
	require.NoError(t, in.MarkHandled(ctx(t), shipping))
	assert.True(t, handled(t, in, shipping))
	assert.ErrorIs(t, in.MarkHandled(ctx(t), billing), recordstore.ErrAlreadyHandled)
}

func (s *inboxSuite) testBusinessKey(t *testing.T) {
	in := s.inbox(t)
	first := entry("billing", "order-1")
	require.NoError(t, in.MarkHandled(ctx(t), first))

	resentAsNew := entry("billing", "order-1")
	assert.True(t, handled(t, in, resentAsNew), "another message with the business key is a duplicate")
	assert.ErrorIs(t, in.MarkHandled(ctx(t), resentAsNew), recordstore.ErrAlreadyHandled)
	tx := s.begin(t, in)
	assert.ErrorIs(t, in.MarkHandledTx(ctx(t), tx, resentAsNew), recordstore.ErrAlreadyHandled)
	require.NoError(t, tx.Rollback())

	withoutKey := resentAsNew
	withoutKey.BusinessKey = ""
	assert.False(t, handled(t, in, withoutKey), "without a business key only the message UUID is looked up")

	sameUUIDOtherKey := first
	sameUUIDOtherKey.BusinessKey = "order-2"
	assert.ErrorIs(t, in.MarkHandled(ctx(t), sameUUIDOtherKey), recordstore.ErrAlreadyHandled, "the message UUID conflicts whatever the business key")
	assert.False(t, handled(t, in, entry("billing", "order-2")), "the refused entry saved nothing")

	otherConsumer := entry("shipping", "order-1")
	assert.False(t, handled(t, in, otherConsumer), "business keys are per consumer")
	require.NoError(t, in.MarkHandled(ctx(t), otherConsumer))
}

// testHandledAs: an inbox that names the entry a message duplicates
// ([recordstore.InboxFinder]) returns the entry it keeps, the sender and
// record of the copy that was handled, not those of the copy that asks.
func (s *inboxSuite) testHandledAs(t *testing.T) {
	in := s.inbox(t)
	finder, ok := in.(recordstore.InboxFinder)
	if !ok {
		t.Skip("the inbox does not implement recordstore.InboxFinder")
	}
	stored := entry("billing", "order-1")
	require.NoError(t, in.MarkHandled(ctx(t), stored))
	plain := entry("billing", "")
	plain.Source, plain.RecordID = "payments-service", 0
	require.NoError(t, in.MarkHandled(ctx(t), plain))

	find := func(e recordstore.InboxEntry) *recordstore.InboxEntry {
		t.Helper()
		found, err := finder.HandledAs(ctx(t), e)
		require.NoError(t, err)
		return found
	}
	// Another message with the business key, from another sender's record.
	resent := entry("billing", "order-1")
	resent.Source, resent.RecordID = "orders-service-eu", 77
	assert.Equal(t, &stored, find(resent), "the entry of the business key, as it was stored")
	// A copy of the same message, carrying another record.
	again := stored
	again.BusinessKey, again.Source, again.RecordID = "", "orders-service-eu", 77
	assert.Equal(t, &stored, find(again), "the entry of the message UUID, as it was stored")
	again = plain
	again.Source, again.RecordID = "orders-service", 42
	assert.Equal(t, &plain, find(again), "an entry stored without a business key has none")
	assert.Nil(t, find(entry("billing", "order-2")), "no entry")
}

func (s *inboxSuite) testEmptyBusinessKeys(t *testing.T) {
	in := s.inbox(t)
	for range 3 {
		e := entry("billing", "")
		require.NoError(t, in.MarkHandled(ctx(t), e), "entries without a business key do not conflict on it")
		assert.True(t, handled(t, in, e))
	}
	tx := s.begin(t, in)
	for range 2 {
		require.NoError(t, in.MarkHandledTx(ctx(t), tx, entry("billing", "")))
	}
	require.NoError(t, tx.Commit())
}

func (s *inboxSuite) testMarkHandledTx(t *testing.T) {
	in := s.inbox(t)
	committed, rolledBack := entry("billing", "order-1"), entry("billing", "order-2")

	tx := s.begin(t, in)
	require.NoError(t, in.MarkHandledTx(ctx(t), tx, committed))
	require.NoError(t, tx.Commit())
	assert.True(t, handled(t, in, committed), "handled once the transaction commits")

	tx = s.begin(t, in)
	require.NoError(t, in.MarkHandledTx(ctx(t), tx, rolledBack))
	require.NoError(t, tx.Rollback())
	assert.False(t, handled(t, in, rolledBack), "a rolled-back entry is not handled")
	require.NoError(t, in.MarkHandled(ctx(t), rolledBack), "and can be saved again")

	assert.ErrorIs(t, in.MarkHandledTx(ctx(t), nil, entry("billing", "")), recordstore.ErrInvalidConfig, "a nil transaction")
}

// testConcurrentTx runs two transactions saving one entry, or two entries
// with one business key: the second waits for the first, and gets
// ErrAlreadyHandled when it commits, saves its entry when it rolls back.
func (s *inboxSuite) testConcurrentTx(t *testing.T) {
	for _, tc := range []struct {
		name   string
		second func(first recordstore.InboxEntry) recordstore.InboxEntry
	}{
		{"SameMessage", func(first recordstore.InboxEntry) recordstore.InboxEntry { return first }},
		{"SameBusinessKey", func(first recordstore.InboxEntry) recordstore.InboxEntry {
			e := entry(first.Consumer, first.BusinessKey)
			return e
		}},
	} {
		for _, commit := range []bool{true, false} {
			name := tc.name + "/FirstRollsBack"
			if commit {
				name = tc.name + "/FirstCommits"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				in := s.inbox(t)
				first := entry("billing", "order-1")
				second := tc.second(first)

				tx := s.begin(t, in)
				require.NoError(t, in.MarkHandledTx(ctx(t), tx, first))

				done := make(chan error, 1)
				go func() { done <- s.markInOwnTx(ctx(t), in, second) }()
				select {
				case err := <-done:
					t.Fatalf("the second transaction returned (%v) while the first held the entry", err)
				case <-time.After(100 * time.Millisecond):
					// No signal says that a statement waits for a lock on
					// every database; the second is given time to return.
				}
				if commit {
					require.NoError(t, tx.Commit())
					assert.ErrorIs(t, <-done, recordstore.ErrAlreadyHandled)
					assert.True(t, handled(t, in, first))
					return
				}
				require.NoError(t, tx.Rollback())
				require.NoError(t, <-done, "the first rolled back, so the second saves the entry")
				assert.True(t, handled(t, in, second))
				if first.MessageUUID != second.MessageUUID {
					assert.True(t, handled(t, in, first), "through the business key the second saved")
				}
			})
		}
	}
}

// markInOwnTx saves e in a transaction of its own, committed when the save
// succeeds.
func (s *inboxSuite) markInOwnTx(ctx context.Context, in recordstore.Inbox, e recordstore.InboxEntry) error {
	tx, err := s.Begin(ctx, in)
	if err != nil {
		return err
	}
	if err := in.MarkHandledTx(ctx, tx, e); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (s *inboxSuite) testClean(t *testing.T) {
	in := s.inbox(t)
	var old, fresh []recordstore.InboxEntry
	for i := range 5 {
		e := entry("billing", "order-"+strings.Repeat("x", i+1))
		require.NoError(t, in.MarkHandled(ctx(t), e))
		if i < 3 {
			s.Age(t, in, e.Consumer, e.MessageUUID)
			old = append(old, e)
		} else {
			fresh = append(fresh, e)
		}
	}
	for _, want := range []int{2, 1, 0} {
		n, err := in.Clean(ctx(t), time.Hour, 2)
		require.NoError(t, err)
		assert.Equal(t, want, n, "Clean deletes at most limit old entries per call")
	}
	for _, e := range old {
		assert.False(t, handled(t, in, e), "an entry older than the window is cleaned")
	}
	for _, e := range fresh {
		assert.True(t, handled(t, in, e), "an entry within the window is kept")
	}
	for _, bad := range [][2]int{{-1, 10}, {0, 0}} {
		_, err := in.Clean(ctx(t), time.Duration(bad[0]), bad[1])
		assert.ErrorIs(t, err, recordstore.ErrInvalidConfig, "age %d, limit %d", bad[0], bad[1])
	}
}

func (s *inboxSuite) testInvalidEntries(t *testing.T) {
	in := s.inbox(t)
	noConsumer, noUUID := entry("", "order-1"), entry("billing", "order-1")
	noUUID.MessageUUID = ""
	invalid := []recordstore.InboxEntry{noConsumer, noUUID}
	// probes would find what a refused entry saved, had it saved
	// anything, such as a too long one cut to fit.
	probes := []recordstore.InboxEntry{entry("billing", "order-1")}
	if s.MaxField > 0 {
		long := strings.Repeat("é", s.MaxField/2) + strings.Repeat("a", s.MaxField%2)
		require.Len(t, long, s.MaxField)
		atLimit := recordstore.InboxEntry{Consumer: long, MessageUUID: long, BusinessKey: long, Source: long}
		require.NoError(t, in.MarkHandled(ctx(t), atLimit), "fields of MaxField bytes are kept")
		assert.True(t, handled(t, in, atLimit))
		for i := range 4 {
			e := entry("billing", "order-1")
			*[]*string{&e.Consumer, &e.MessageUUID, &e.BusinessKey, &e.Source}[i] = long + "a"
			invalid = append(invalid, e)
		}
		probes = append(probes, entry("billing", long))
	} else {
		t.Log("InboxContract.MaxField is 0: no field is too long")
	}
	tx := s.begin(t, in)
	for i, e := range invalid {
		assert.ErrorIs(t, in.MarkHandled(ctx(t), e), recordstore.ErrInvalidEntry, "entry #%d", i)
		assert.ErrorIs(t, in.MarkHandledTx(ctx(t), tx, e), recordstore.ErrInvalidEntry, "entry #%d in a transaction", i)
		_, err := in.Handled(ctx(t), e)
		assert.ErrorIs(t, err, recordstore.ErrInvalidEntry, "Handled of entry #%d", i)
	}
	require.NoError(t, tx.Commit())
	for _, p := range probes {
		assert.False(t, handled(t, in, p), "a refused entry saved nothing (business key %.10q…)", p.BusinessKey)
	}
}

// testAnyBytes: an entry whose fields hold bytes that a database may not
// keep (a NUL byte, bytes that are not UTF-8, as another service's message
// may carry) is either kept, and then found and refused a second time like
// any entry, or refused by every method with ErrInvalidEntry, never with
// an error that a retry would answer differently; a transaction it was
// refused in stays usable.
func (s *inboxSuite) testAnyBytes(t *testing.T) {
	in := s.inbox(t)
	for j, bad := range []string{"\x00", "a\x00b", "\xff", "a\xc3\x28b"} {
		for i, field := range []string{"Consumer", "MessageUUID", "BusinessKey", "Source"} {
			e := entry("billing", fmt.Sprintf("order-%d-%d", j, i))
			*[]*string{&e.Consumer, &e.MessageUUID, &e.BusinessKey, &e.Source}[i] += bad
			found, err := in.Handled(ctx(t), e)
			if err != nil {
				assert.ErrorIs(t, err, recordstore.ErrInvalidEntry, "Handled of %s %q", field, bad)
				assert.ErrorIs(t, in.MarkHandled(ctx(t), e), recordstore.ErrInvalidEntry, "MarkHandled of %s %q", field, bad)
				tx := s.begin(t, in)
				assert.ErrorIs(t, in.MarkHandledTx(ctx(t), tx, e), recordstore.ErrInvalidEntry, "MarkHandledTx of %s %q", field, bad)
				assert.NoError(t, tx.Commit(), "the transaction a refused entry was given stays usable (%s %q)", field, bad)
				continue
			}
			assert.False(t, found, "%s %q", field, bad)
			require.NoError(t, in.MarkHandled(ctx(t), e), "an entry Handled answered for is kept (%s %q)", field, bad)
			assert.True(t, handled(t, in, e), "%s %q", field, bad)
			assert.ErrorIs(t, in.MarkHandled(ctx(t), e), recordstore.ErrAlreadyHandled, "%s %q", field, bad)
		}
	}
}
