package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
)

// TxPublisher publishes tracked messages inside the caller's database
// transaction, so that their records commit or roll back with the business
// rows, and sends them after the commit (a crash in between leaves them to
// the next replay). Wrap the transaction, whose Commit then sends:
//
//	ptx := txPub.Wrap(tx)       // tx is a *sql.Tx or *sqlx.Tx
//	defer ptx.Rollback()        // no-op after Commit
//	// ... business writes through tx (or ptx) ...
//	err = ptx.Publish(ctx, "orders", msg)
//	err = ptx.Commit()          // commits, then sends
//
// [TxPublisher.PublishTx] returns the send instead, for code that commits
// elsewhere. The topics' stores must implement [recordstore.TxInserter] on
// the transaction's database.
type TxPublisher struct {
	pub message.Publisher
	reg *Registry
}

// NewTxPublisher returns a transactional publisher over pub. Messages to
// untracked topics are not recorded; they too are sent only after the
// commit.
func NewTxPublisher(reg *Registry, pub message.Publisher) (*TxPublisher, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: publisher is nil", ErrInvalidConfig)
	}
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	return &TxPublisher{pub: pub, reg: reg}, nil
}

// SendFunc sends messages whose records a transaction saved. Call it once,
// after the transaction committed; it returns a [*SendError] when the
// publisher fails, and the records stay pending for the next replay.
type SendFunc func() error

// PublishTx saves one record per message of a tracked topic through tx and
// returns the send to call after tx commits (not after a rollback). If the
// insert fails it returns an [*InsertError]: roll back. An untracked topic's
// send publishes the messages as they are.
func (p *TxPublisher) PublishTx(ctx context.Context, tx Tx, topic string, msgs ...*message.Message) (SendFunc, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: transaction is nil", ErrInvalidConfig)
	}
	t := p.reg.lookup(topic)
	if t == nil || len(msgs) == 0 {
		return func() error { return p.pub.Publish(topic, msgs...) }, nil
	}
	inserter, ok := t.store.(recordstore.TxInserter)
	if !ok {
		return nil, &InsertError{Topic: topic, Count: len(msgs), Err: fmt.Errorf("%w: %T has no InsertTx", ErrNotSupported, t.store)}
	}
	tr := p.reg.tracer()
	if tr == nil {
		return p.save(ctx, tx, t, inserter, msgs)
	}
	if err := nilMessage(t, msgs); err != nil {
		return nil, err
	}
	end := tr.TracePublish(topic, msgs, true)
	send, err := p.save(ctx, tx, t, inserter, msgs)
	endStep(end, err)
	return send, err
}

// save inserts the records of msgs through tx and stamps the messages.
func (p *TxPublisher) save(ctx context.Context, tx Tx, t *tracked, inserter recordstore.TxInserter, msgs []*message.Message) (SendFunc, error) {
	topic := t.topic
	records, err := recordsOf(t, msgs)
	if err != nil {
		return nil, err
	}
	identity, err := inserter.IdentityTx(ctx, tx)
	if err != nil {
		return nil, &InsertError{Topic: topic, Count: len(msgs), Err: err}
	}
	if err := inserter.InsertTx(ctx, tx, records); err != nil {
		return nil, &InsertError{Topic: topic, Count: len(msgs), Err: err}
	}
	stamp(t, identity, msgs, records)
	if t.ordersRemote() {
		return func() error { return sendStamped(ctx, p.pub, p.reg, t, msgs, records, false) }, nil
	}
	return func() error { return sendRecorded(p.pub, p.reg, t, msgs, records) }, nil
}

// Wrap returns tx wrapped so that [PublishingTx.Publish] saves records in
// it and [PublishingTx.Commit] sends them once the commit succeeded.
func (p *TxPublisher) Wrap(tx Tx) *PublishingTx {
	return &PublishingTx{Tx: tx, p: p}
}

// PublishingTx is a transaction whose Commit sends the messages published in
// it. It is itself a [Tx]: business writes, [CompleteTx] and further
// publishes may all go through it. Safe for concurrent use.
type PublishingTx struct {
	Tx
	p *TxPublisher

	mu    sync.Mutex
	sends []SendFunc
	done  bool
}

// Publish saves the records of msgs in the transaction, as
// [TxPublisher.PublishTx] does, and queues the messages to be sent by
// Commit.
func (t *PublishingTx) Publish(ctx context.Context, topic string, msgs ...*message.Message) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return ErrTxDone
	}
	send, err := t.p.PublishTx(ctx, t.Tx, topic, msgs...)
	if err != nil {
		return err
	}
	t.sends = append(t.sends, send)
	return nil
}

// Commit commits the transaction and then sends every message published in
// it, in the order they were published. A commit error is returned as it is
// and nothing is sent. Send failures are joined; each is a [*SendError]
// whose records, committed, stay pending for the next replay.
func (t *PublishingTx) Commit() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	sends, err := t.end(t.Tx.Commit)
	if err != nil {
		return err
	}
	var errs []error
	for _, send := range sends {
		if err := send(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Rollback rolls the transaction back and forgets the messages published in
// it. After Commit it does nothing and returns [ErrTxDone], so that it can be
// deferred.
func (t *PublishingTx) Rollback() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err := t.end(t.Tx.Rollback)
	return err
}

// end ends the transaction with commit or rollback, once, and hands over
// the queued sends. The caller holds t.mu.
func (t *PublishingTx) end(finish func() error) ([]SendFunc, error) {
	if t.done {
		return nil, ErrTxDone
	}
	t.done = true
	sends := t.sends
	t.sends = nil
	return sends, finish()
}
