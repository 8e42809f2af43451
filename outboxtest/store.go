package outboxtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// StoreConfig configures [NewStore].
type StoreConfig struct {
	// DeleteCompleted makes the store delete a record once it is complete,
	// as sqlstore.Delete does, instead of keeping it marked completed.
	// Defaults to false (keep, as sqlstore.Mark does).
	DeleteCompleted bool
	// Lease turns on the delivery lease (see [recordstore.Releaser]):
	// CheckPending claims a pending delivery for this long. Defaults to 0,
	// no lease.
	Lease time.Duration
	// Now is the store's clock, for completion stamps, leases, retry
	// schedules and ages; a test that moves it controls them all. Defaults
	// to time.Now.
	Now func() time.Time
}

// Store is an in-memory [recordstore.Store] for tests, safe for
// concurrent use. Besides the Store contract it implements
// [recordstore.Verifier], [recordstore.Releaser],
// [recordstore.FailureRecorder], [recordstore.Requeuer],
// [recordstore.StaleClaimer], [recordstore.Cleaner],
// [recordstore.StatusReader], [recordstore.SendStamper] and
// [recordstore.ConsumerRetirer], [recordstore.ReplayClaimer],
// [recordstore.TxInserter] and [recordstore.TxCompleter], as the sqlstore
// stores do. Its transactions are a [Tx] of this package (or an
// outbox.PublishingTx over one), for outbox.TxPublisher and
// outbox.CompleteTx. It passes the contract suite of sqlstore/storetest.
//
// It keeps every record it was given for the assertions ([Store.Records],
// [RequirePublished], ...), also the ones it deleted or cleaned; those
// behave as gone for the outbox.
type Store struct {
	cfg      StoreConfig
	identity string

	mu     sync.Mutex
	nextID int64
	byID   map[int64]*record // the records the store holds
	order  []int64           // ids of byID, ascending
	all    []*record         // every record ever saved, in id order
	// byOrigin holds the records of byID saved with an Origin.
	byOrigin map[string]*record
	// seen is when each consumer of each topic was last seen.
	seen map[string]map[string]time.Time
	// completing holds the deliveries ("id\x00consumer") an open
	// transaction completes (CompleteTx).
	completing map[string]bool
}

// record is one saved record and its bookkeeping.
type record struct {
	rec         recordstore.Record // without Consumers, Origin and OrderKey
	origin      string
	orderKey    string
	consumers   []string // declared, distinct, in order
	deliveries  map[string]*delivery
	created     time.Time
	lastSent    time.Time // zero: never sent after the publish
	completed   time.Time // zero: not completed
	completedBy string
	abandoned   time.Time
	gone        bool // deleted or cleaned; kept for the assertions only
	attempt     attempt
}

// attempt is what a record without consumers, or one delivery, keeps of
// its handling.
type attempt struct {
	attempts   int
	lastError  string
	due        time.Time // zero: due now
	leaseOwner string
	leaseUntil time.Time
}

// delivery is one consumer's delivery of a record with consumers.
type delivery struct {
	completed time.Time
	abandoned time.Time
	attempt
}

func (d *delivery) pending() bool { return d.completed.IsZero() && d.abandoned.IsZero() }

// savedFor reports whether the record was saved for the delivery's
// message, or the delivery names none.
func (r *record) savedFor(d recordstore.Delivery) bool { return d.UUID == "" || d.UUID == r.rec.UUID }

// pending reports whether the record waits for a consumer.
func (r *record) pending() bool { return r.completed.IsZero() && r.abandoned.IsZero() }

var (
	_ recordstore.Store                  = (*Store)(nil)
	_ recordstore.Verifier               = (*Store)(nil)
	_ recordstore.Releaser               = (*Store)(nil)
	_ recordstore.FailureRecorder        = (*Store)(nil)
	_ recordstore.Requeuer               = (*Store)(nil)
	_ recordstore.StaleClaimer           = (*Store)(nil)
	_ recordstore.ReplayClaimer          = (*Store)(nil)
	_ recordstore.KeyClaimer             = (*Store)(nil)
	_ recordstore.KeyPredecessorMessages = (*Store)(nil)
	_ recordstore.TxInserter             = (*Store)(nil)
	_ recordstore.TxCompleter            = (*Store)(nil)
	_ recordstore.Cleaner                = (*Store)(nil)
	_ recordstore.StatusReader           = (*Store)(nil)
	_ recordstore.SendStamper            = (*Store)(nil)
	_ recordstore.ConsumerRetirer        = (*Store)(nil)
	_ recordstore.ConsumerRecorder       = (*Store)(nil)
)

// Lease is the delivery lease the store was configured with
// ([StoreConfig.Lease]); zero without one.
func (s *Store) Lease() time.Duration { return max(s.cfg.Lease, 0) }

// NewStore returns an empty in-memory store with an identity of its own.
// A negative cfg.Lease is taken as none.
func NewStore(cfg StoreConfig) *Store {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &Store{cfg: cfg, identity: hex.EncodeToString(b[:]), byID: map[int64]*record{}, byOrigin: map[string]*record{},
		seen: map[string]map[string]time.Time{}, completing: map[string]bool{}}
}

func (s *Store) now() time.Time { return s.cfg.Now() }

// Identity implements [recordstore.Store]: a random identity drawn by
// NewStore, the same for the store's whole life.
func (s *Store) Identity(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	return s.identity, nil
}

// Verify implements [recordstore.Verifier]; an in-memory store is always
// ready.
func (s *Store) Verify(ctx context.Context) error { return ctx.Err() }

// Insert implements [recordstore.Store]. The store keeps copies of the
// records' payload and metadata. A record whose Origin a record it holds
// has gets that record, as sqlstore's do.
func (s *Store) Insert(ctx context.Context, records []recordstore.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for i := range records {
		if saved := s.byOrigin[records[i].Origin]; saved != nil {
			c := copyRecord(saved.rec)
			records[i].ID, records[i].UUID, records[i].Payload, records[i].Metadata = c.ID, c.UUID, c.Payload, c.Metadata
			continue
		}
		s.add(s.newRecord(&records[i], now))
	}
	return nil
}

// newRecord gives rec the next id and returns its record, not yet in the
// store. The caller holds s.mu.
func (s *Store) newRecord(rec *recordstore.Record, now time.Time) *record {
	s.nextID++
	rec.ID = s.nextID
	r := &record{rec: copyRecord(*rec), origin: rec.Origin, orderKey: rec.OrderKey, created: now}
	r.rec.Consumers, r.rec.Origin, r.rec.OrderKey = nil, "", ""
	for _, c := range rec.Consumers {
		if !slices.Contains(r.consumers, c) {
			r.consumers = append(r.consumers, c)
		}
	}
	if len(r.consumers) > 0 {
		r.deliveries = make(map[string]*delivery, len(r.consumers))
		for _, c := range r.consumers {
			r.deliveries[c] = &delivery{}
		}
	}
	return r
}

// add puts r in the store, in id order: a transaction's records come in
// at its commit, after records with higher ids. The caller holds s.mu.
func (s *Store) add(r *record) {
	s.byID[r.rec.ID] = r
	if r.origin != "" {
		s.byOrigin[r.origin] = r
	}
	i, _ := slices.BinarySearch(s.order, r.rec.ID)
	s.order = slices.Insert(s.order, i, r.rec.ID)
	j, _ := slices.BinarySearchFunc(s.all, r.rec.ID, func(r *record, id int64) int { return cmp.Compare(r.rec.ID, id) })
	s.all = slices.Insert(s.all, j, r)
}

// copyRecord returns r with a payload and metadata of its own, never nil.
func copyRecord(r recordstore.Record) recordstore.Record {
	r.Payload = append([]byte{}, r.Payload...)
	r.Metadata = maps.Clone(r.Metadata)
	if r.Metadata == nil {
		r.Metadata = map[string]string{}
	}
	r.Consumers = slices.Clone(r.Consumers)
	return r
}

// CheckPending implements [recordstore.Store], with the verdicts in the
// order the sqlstore stores give them: unknown record, another message's
// record, missing delivery, not pending or completed by another consumer,
// not due, then, with a lease, leased.
func (s *Store) CheckPending(ctx context.Context, d recordstore.Delivery) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r := s.byID[d.ID]
	switch {
	case r == nil && s.cfg.DeleteCompleted:
		// A deleting store cannot tell a completed record from one it
		// never had.
		return recordstore.ErrNotPending
	case r == nil || r.rec.Topic != d.Topic:
		return fmt.Errorf("outboxtest: no record %d of topic %q: %w", d.ID, d.Topic, recordstore.ErrUnknownRecord)
	case !r.savedFor(d):
		return fmt.Errorf("outboxtest: record %d was saved for another message than %q: %w", d.ID, d.UUID, recordstore.ErrMessageMismatch)
	}
	r.adopt(d)
	a := &r.attempt
	if r.deliveries != nil {
		dl := r.deliveries[d.Consumer]
		switch {
		case dl == nil && declares(d):
			// Complete before its topic declared this consumer.
			return recordstore.ErrNotPending
		case dl == nil:
			return fmt.Errorf("outboxtest: record %d has no delivery for consumer %q: %w", d.ID, d.Consumer, recordstore.ErrNoDelivery)
		case !dl.pending():
			return recordstore.ErrNotPending
		}
		a = &dl.attempt
	} else {
		switch {
		case !r.abandoned.IsZero():
			return recordstore.ErrNotPending
		case !r.completed.IsZero():
			if d.Consumer == "" || r.completedBy == "" || r.completedBy == d.Consumer || declares(d) {
				return recordstore.ErrNotPending
			}
			return &recordstore.ConsumerConflictError{ID: d.ID, Consumer: d.Consumer, CompletedBy: r.completedBy}
		}
	}
	if err := s.heldBy(r, d); err != nil {
		return err
	}
	if wait := a.due.Sub(now); wait > 0 {
		return &recordstore.NotDueError{ID: d.ID, Wait: wait}
	}
	if s.cfg.Lease > 0 {
		if now.Before(a.leaseUntil) {
			return recordstore.ErrLeased
		}
		a.leaseOwner, a.leaseUntil = d.Lease, now.Add(s.cfg.Lease)
	}
	return nil
}

// Complete implements [recordstore.Store]. A record without consumers
// remembers which consumer completed it, so that another consumer's
// CheckPending reports a [*recordstore.ConsumerConflictError]. A delivery
// of another message than the record's gets [recordstore.ErrNotPending],
// as from the sqlstore stores.
func (s *Store) Complete(ctx context.Context, d recordstore.Delivery) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.byID[d.ID]
	if r == nil || !r.pending() || !r.savedFor(d) {
		return recordstore.ErrNotPending
	}
	now := s.now()
	r.adopt(d)
	if r.deliveries == nil {
		r.completedBy = d.Consumer
		s.finish(r, now)
		return nil
	}
	dl := r.deliveries[d.Consumer]
	if dl == nil || !dl.pending() {
		return recordstore.ErrNotPending
	}
	dl.completed = now
	dl.leaseUntil = time.Time{}
	s.rollUp(r, now)
	return nil
}

// declares reports whether d is the delivery of one of the consumers its
// topic declares now.
func declares(d recordstore.Delivery) bool {
	return len(d.Declared) > 0 && slices.Contains(d.Declared, d.Consumer)
}

// adopt gives a pending record of d's topic a pending delivery for each
// consumer of d.Declared it has none for, when d's consumer is one of
// them, as the sqlstore stores do (see [recordstore.Delivery.Declared]).
func (r *record) adopt(d recordstore.Delivery) {
	if !declares(d) || !r.pending() || r.rec.Topic != d.Topic || r.deliveries[d.Consumer] != nil {
		return
	}
	if r.deliveries == nil {
		r.deliveries = make(map[string]*delivery, len(d.Declared))
	}
	for _, c := range d.Declared {
		if r.deliveries[c] == nil {
			r.consumers = append(r.consumers, c)
			r.deliveries[c] = &delivery{}
		}
	}
}

// rollUp completes or abandons a record with consumers once none of its
// deliveries is pending.
func (s *Store) rollUp(r *record, now time.Time) {
	abandoned := false
	for _, dl := range r.deliveries {
		if dl.pending() {
			return
		}
		abandoned = abandoned || !dl.abandoned.IsZero()
	}
	if abandoned {
		r.abandoned = now
		return
	}
	s.finish(r, now)
}

// finish completes a record: marks it, or deletes it on a deleting store.
func (s *Store) finish(r *record, now time.Time) {
	r.completed = now
	r.attempt.leaseUntil = time.Time{}
	if s.cfg.DeleteCompleted {
		s.remove(r.rec.ID)
	}
}

// remove drops a record from what the store holds.
func (s *Store) remove(id int64) {
	r := s.byID[id]
	if r == nil {
		return
	}
	r.gone = true
	delete(s.byID, id)
	delete(s.byOrigin, r.origin)
	if i, found := slices.BinarySearch(s.order, id); found {
		s.order = slices.Delete(s.order, i, i+1)
	}
}

// PendingAfter implements [recordstore.Store].
func (s *Store) PendingAfter(ctx context.Context, topic string, afterID int64, limit int) ([]recordstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []recordstore.Record
	i, _ := slices.BinarySearch(s.order, afterID+1)
	for _, id := range s.order[i:] {
		if len(out) >= limit {
			break
		}
		if r := s.byID[id]; r.rec.Topic == topic && r.pending() {
			out = append(out, copyRecord(r.rec))
		}
	}
	return out, nil
}

// heldBy is CheckPending's [*recordstore.HeldError] for an ordered delivery
// of r whose earliest earlier record of its topic and key is not complete
// for the consumer; nil otherwise. The caller holds s.mu.
func (s *Store) heldBy(r *record, d recordstore.Delivery) error {
	if !d.Ordered || r.orderKey == "" {
		return nil
	}
	for _, id := range s.order {
		if id >= r.rec.ID {
			break
		}
		e := s.byID[id]
		if e.rec.Topic != r.rec.Topic || e.orderKey != r.orderKey {
			continue
		}
		pending, abandoned := e.pendingFor(d.Consumer)
		if pending || (abandoned && !d.SkipAbandoned) {
			return &recordstore.HeldError{ID: d.ID, Before: e.rec.ID, Abandoned: abandoned}
		}
	}
	return nil
}

// pendingFor reports whether the record is pending for the consumer, or
// abandoned for it: its own delivery on a record with consumers (a
// record without one for the consumer counts as pending while the record
// is, as it is adopted when checked), the record's state otherwise.
func (r *record) pendingFor(consumer string) (pending, abandoned bool) {
	if r.deliveries == nil {
		return r.pending(), !r.abandoned.IsZero()
	}
	dl := r.deliveries[consumer]
	if dl == nil {
		return r.pending(), false
	}
	return dl.pending(), !dl.abandoned.IsZero()
}
