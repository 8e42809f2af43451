package outbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
)

// CompleteTx completes the record of msg, the tracked message being
// handled, inside the handler's own transaction tx, for handlers whose
// business data lives in the same database as the record: the business
// writes and the completion commit together, and the middleware then skips
// its own completion. Call it first in the transaction, before the business
// writes:
//
//	tx, _ := db.BeginTx(ctx, nil)
//	defer tx.Rollback()
//	switch err := outbox.CompleteTx(ctx, tx, msg); {
//	case errors.Is(err, outbox.ErrNotPending):
//		return nil, nil // another copy did it: ack, do nothing
//	case err != nil:
//		return nil, err
//	}
//	// ... business writes through tx ...
//	return nil, tx.Commit()
//
// CompleteTx locks the record in tx. A second copy of the message handled at
// the same moment waits for that lock; when the first transaction commits it
// gets [ErrNotPending] and must not repeat the business writes, so the
// business effect happens exactly once. If the first transaction rolls back,
// the second copy completes the record instead.
//
// It returns nil, doing nothing, for a message the middleware does not track
// (no record in its context, e.g. in a test binary with tracking off). It
// returns an error wrapping [ErrNotSupported] when the record's store does not
// implement [recordstore.TxCompleter].
//
// A handler that completes in its transaction should publish what it
// produces through [TxPublisher] in the same transaction rather than return
// messages to the router: the record is completed at commit, so a router that
// then fails to publish the returned messages would not see the message again.
// If the handler returns an error after CompleteTx, its transaction must have
// rolled back; a completion that committed stands. A handler that rolls its
// transaction back and returns nil has its message acked and the record
// left pending (the middleware skips its own completion after CompleteTx):
// the next replay or the stale resubmitter sends it again. Return an error
// after a rollback to have the broker redeliver it now.
func CompleteTx(ctx context.Context, tx Tx, msg *message.Message) error {
	d, ok := msg.Context().Value(recordKey{}).(*delivery)
	if !ok {
		return nil
	}
	c, ok := d.store.(recordstore.TxCompleter)
	if !ok {
		return fmt.Errorf("%w: %T has no CompleteTx (record %d of %q)", ErrNotSupported, d.store, d.d.ID, d.d.Topic)
	}
	if err := c.CompleteTx(ctx, tx, d.d); err != nil {
		return err
	}
	d.completed.Store(true)
	return nil
}

// Tx is a database transaction the caller began and will commit or roll
// back, such as *sql.Tx or *sqlx.Tx; see [recordstore.Tx].
type Tx = recordstore.Tx
