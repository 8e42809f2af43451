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
// A second copy handled at the same moment waits for the record's lock
// and then gets ErrNotPending, so the effect happens once. It returns nil
// for a message the middleware does not track, and an error wrapping
// [ErrNotSupported] when the store lacks [recordstore.TxCompleter].
// Publish what the handler produces through [TxPublisher] in the same
// transaction; docs/guarantees.md says what a rollback leaves.
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
