package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/recordstore"
)

// Inbox is an in-memory [recordstore.Inbox] for tests of handlers that
// deduplicate other services' messages, safe for concurrent use. It passes
// the inbox contract suite of sqlstore/storetest (RunInbox), as sqlstore's
// Inbox does, but keeps fields of any length.
//
// MarkHandledTx joins a [Tx] of this package: the entry is held for the
// transaction, invisible to Handled, until Tx.Commit makes it handled or
// Tx.Rollback drops it; meanwhile a MarkHandled or MarkHandledTx of the same
// message or business key by another caller waits, and then gets
// [recordstore.ErrAlreadyHandled] or saves its entry, as a SQL inbox's
// transactions do. Any other [recordstore.Tx], such as a *sql.Tx, is
// refused with an error wrapping [recordstore.ErrNotSupported]: the inbox
// cannot learn whether it commits. A handler that writes its effect in the
// transaction of its inbox entry ([outbox.InboxTx]) is tested on the SQLite
// inbox of the outboxtest/sqlitetest package instead.
type Inbox struct {
	now func() time.Time
	id  string

	mu sync.Mutex
	// seq numbers the entries in the order they were saved.
	seq int64
	// byUUID and byKey index the entries, committed or held for a Tx.
	byUUID map[inboxKey]*inboxEntry
	byKey  map[inboxKey]*inboxEntry
}

var _ recordstore.Inbox = (*Inbox)(nil)

// inboxKey is a consumer and its message UUID, or its business key.
type inboxKey struct{ consumer, key string }

// inboxEntry is one entry and its state.
type inboxEntry struct {
	e         recordstore.InboxEntry
	seq       int64
	handledAt time.Time
	// tx holds the entry until it ends; nil once committed. settled is
	// closed when it ends.
	tx      *Tx
	settled chan struct{}
}

// NewInbox returns an empty in-memory inbox. Its entries are stamped with
// time.Now.
func NewInbox() *Inbox {
	return &Inbox{now: time.Now, id: watermill.NewUUID(), byUUID: map[inboxKey]*inboxEntry{}, byKey: map[inboxKey]*inboxEntry{}}
}

// Entries returns the committed entries, in the order they were saved,
// for assertions.
func (in *Inbox) Entries() []recordstore.InboxEntry {
	in.mu.Lock()
	defer in.mu.Unlock()
	var all []*inboxEntry
	for _, x := range in.byUUID {
		if x.tx == nil {
			all = append(all, x)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].seq < all[j].seq })
	out := make([]recordstore.InboxEntry, len(all))
	for i, x := range all {
		out[i] = x.e
	}
	return out
}

// Handled implements [recordstore.Inbox]. An entry held for a [Tx] that
// has not committed is not handled yet.
func (in *Inbox) Handled(ctx context.Context, e recordstore.InboxEntry) (bool, error) {
	found, err := in.HandledAs(ctx, e)
	return found != nil, err
}

var _ recordstore.InboxFinder = (*Inbox)(nil)

// HandledAs implements [recordstore.InboxFinder]: the committed entry that
// Handled finds, nil when there is none.
func (in *Inbox) HandledAs(ctx context.Context, e recordstore.InboxEntry) (*recordstore.InboxEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validateEntry(e); err != nil {
		return nil, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	x := in.find(e)
	if x == nil || x.tx != nil {
		return nil, nil
	}
	found := x.e
	return &found, nil
}

// Identity returns the inbox's identity, random and its own: the
// receiving service's name in the confirmations it sends.
func (in *Inbox) Identity(context.Context) (string, error) { return in.id, nil }

// MarkHandled implements [recordstore.Inbox].
func (in *Inbox) MarkHandled(ctx context.Context, e recordstore.InboxEntry) error {
	return in.mark(ctx, nil, e)
}

// MarkHandledTx implements [recordstore.Inbox] for a [Tx] of this package;
// see [Inbox] for what it does.
func (in *Inbox) MarkHandledTx(ctx context.Context, tx recordstore.Tx, e recordstore.InboxEntry) error {
	t, err := kitTx(tx)
	if errors.Is(err, recordstore.ErrNotSupported) {
		return fmt.Errorf("%w; to test a handler that writes its effect in the outbox.InboxTx transaction, use an SQL inbox in process: outboxtest/sqlitetest.Open, its DB.Inbox and a transaction of its DB", err)
	}
	if err != nil {
		return err
	}
	return in.mark(ctx, t, e)
}

// mark saves the entry, committed when tx is nil, held for tx otherwise,
// after waiting for any other transaction that holds its message or
// business key.
func (in *Inbox) mark(ctx context.Context, tx *Tx, e recordstore.InboxEntry) error {
	if err := validateEntry(e); err != nil {
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		in.mu.Lock()
		x := in.find(e)
		if x != nil && x.tx != nil && x.tx != tx {
			in.mu.Unlock()
			select {
			case <-x.settled:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if x != nil {
			in.mu.Unlock()
			return fmt.Errorf("%w: consumer %q, message %q, business key %q", recordstore.ErrAlreadyHandled, e.Consumer, e.MessageUUID, e.BusinessKey)
		}
		in.seq++
		x = &inboxEntry{e: e, seq: in.seq, handledAt: in.now()}
		if tx != nil {
			if err := tx.hold(func(commit bool) { in.settle(x, commit) }); err != nil {
				in.mu.Unlock()
				return err
			}
			x.tx, x.settled = tx, make(chan struct{})
		}
		in.byUUID[inboxKey{e.Consumer, e.MessageUUID}] = x
		if e.BusinessKey != "" {
			in.byKey[inboxKey{e.Consumer, e.BusinessKey}] = x
		}
		in.mu.Unlock()
		return nil
	}
}

// find returns the entry with e's message UUID, or with its business key,
// nil when there is none. The caller holds mu.
func (in *Inbox) find(e recordstore.InboxEntry) *inboxEntry {
	if x := in.byUUID[inboxKey{e.Consumer, e.MessageUUID}]; x != nil {
		return x
	}
	if e.BusinessKey == "" {
		return nil
	}
	return in.byKey[inboxKey{e.Consumer, e.BusinessKey}]
}

// settle commits or drops an entry held for a transaction that ended.
func (in *Inbox) settle(x *inboxEntry, commit bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if commit {
		x.tx = nil
	} else {
		in.remove(x)
	}
	close(x.settled)
}

// remove deletes an entry from the indexes. The caller holds mu.
func (in *Inbox) remove(x *inboxEntry) {
	delete(in.byUUID, inboxKey{x.e.Consumer, x.e.MessageUUID})
	if x.e.BusinessKey != "" {
		delete(in.byKey, inboxKey{x.e.Consumer, x.e.BusinessKey})
	}
}

// Clean implements [recordstore.Inbox]: it deletes up to limit committed
// entries handled more than olderThan ago, oldest first.
func (in *Inbox) Clean(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := checkClean(olderThan, limit); err != nil {
		return 0, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	cutoff := in.now().Add(-olderThan)
	var old []*inboxEntry
	for _, x := range in.byUUID {
		if x.tx == nil && x.handledAt.Before(cutoff) {
			old = append(old, x)
		}
	}
	sort.Slice(old, func(i, j int) bool { return old[i].handledAt.Before(old[j].handledAt) })
	old = old[:min(limit, len(old))]
	for _, x := range old {
		in.remove(x)
	}
	return len(old), nil
}

// validateEntry refuses an entry without a consumer or a message UUID.
func validateEntry(e recordstore.InboxEntry) error {
	switch {
	case e.Consumer == "":
		return fmt.Errorf("%w: Consumer is empty", recordstore.ErrInvalidEntry)
	case e.MessageUUID == "":
		return fmt.Errorf("%w: MessageUUID is empty (consumer %q)", recordstore.ErrInvalidEntry, e.Consumer)
	}
	return nil
}
