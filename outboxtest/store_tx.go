package outboxtest

import (
	"context"
	"fmt"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/recordstore"
)

// kitTx returns the [Tx] of this package that tx is, or that the
// outbox.PublishingTx tx wraps.
func kitTx(tx recordstore.Tx) (*Tx, error) {
	for range 8 {
		switch t := tx.(type) {
		case *Tx:
			return t, nil
		case *outbox.PublishingTx:
			tx = t.Tx
			continue
		case nil:
			return nil, fmt.Errorf("%w: transaction is nil", recordstore.ErrInvalidConfig)
		}
		break
	}
	return nil, fmt.Errorf("%w: the in-memory store joins only an outboxtest.Tx, not a %T", recordstore.ErrNotSupported, tx)
}

// InsertTx implements [recordstore.TxInserter] for a [Tx] of this package:
// the records get their ids at once and appear in the store when tx
// commits; a rollback drops them. A record whose Origin the store holds
// gets the saved record, as with Insert.
func (s *Store) InsertTx(ctx context.Context, tx recordstore.Tx, records []recordstore.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := kitTx(tx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var held []*record
	for i := range records {
		if saved := s.byOrigin[records[i].Origin]; saved != nil {
			c := copyRecord(saved.rec)
			records[i].ID, records[i].UUID, records[i].Payload, records[i].Metadata = c.ID, c.UUID, c.Payload, c.Metadata
			continue
		}
		held = append(held, s.newRecord(&records[i], now))
	}
	return t.hold(func(commit bool) {
		if !commit {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, r := range held {
			s.add(r)
		}
	})
}

// IdentityTx implements [recordstore.TxInserter].
func (s *Store) IdentityTx(ctx context.Context, _ recordstore.Tx) (string, error) {
	return s.Identity(ctx)
}

// CompleteTx implements [recordstore.TxCompleter] for a [Tx] of this
// package: it returns ErrNotPending, as Complete does, when the delivery
// is not pending, and completes it when tx commits; a rollback leaves it
// pending. A delivery another open transaction completes is not pending
// for this one.
func (s *Store) CompleteTx(ctx context.Context, tx recordstore.Tx, d recordstore.Delivery) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := kitTx(tx)
	if err != nil {
		return err
	}
	key := fmt.Sprintf("%d\x00%s", d.ID, d.Consumer)
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.byID[d.ID]
	if r == nil || !r.pending() || !r.savedFor(d) || s.completing[key] {
		return recordstore.ErrNotPending
	}
	if dl := r.deliveries[d.Consumer]; dl != nil && !dl.pending() {
		return recordstore.ErrNotPending
	}
	s.completing[key] = true
	return t.hold(func(commit bool) {
		s.mu.Lock()
		delete(s.completing, key)
		s.mu.Unlock()
		if commit {
			// Completed meanwhile outside the transaction: nothing to do.
			_ = s.Complete(context.Background(), d)
		}
	})
}
