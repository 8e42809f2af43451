package outbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmoutbox/outbox"
)

// An order row and its "order placed" message commit together: the message
// is sent only after the commit, and a receiver completes the record in its
// own transaction together with its business write, so that a second copy
// has no effect.
func ExampleTxPublisher() {
	store, cleanup := exampleStore()
	defer cleanup()
	db := store.DB()
	ctx := context.Background()
	db.MustExec("CREATE TABLE orders (id TEXT)")
	db.MustExec("CREATE TABLE shipments (order_id TEXT)")
	reg, _ := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 2}, watermill.NopLogger{})
	sub, _ := pubSub.Subscribe(ctx, "orders")

	// The publishing side.
	txPub, _ := outbox.NewTxPublisher(reg, pubSub)
	tx, _ := db.BeginTxx(ctx, nil)
	ptx := txPub.Wrap(tx)
	defer ptx.Rollback() //nolint:errcheck // no-op after Commit
	_, _ = ptx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ('order-1')")
	_ = ptx.Publish(ctx, "orders", message.NewMessage(watermill.NewUUID(), []byte("order-1")))
	if err := ptx.Commit(); err != nil { // commits, then sends
		panic(err)
	}

	// The receiving side.
	mw, _ := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	ship := mw(func(msg *message.Message) ([]*message.Message, error) {
		tx, err := db.BeginTxx(msg.Context(), nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback() //nolint:errcheck // rolled back unless committed
		switch err := outbox.CompleteTx(msg.Context(), tx, msg); {
		case errors.Is(err, outbox.ErrNotPending):
			return nil, nil // another copy shipped it
		case err != nil:
			return nil, err
		}
		if _, err := tx.ExecContext(msg.Context(), "INSERT INTO shipments (order_id) VALUES (?)", string(msg.Payload)); err != nil {
			return nil, err
		}
		return nil, tx.Commit()
	})
	msg := <-sub
	_, _ = ship(msg.Copy())
	_, _ = ship(msg.Copy()) // a duplicate delivery
	msg.Ack()

	var shipments int
	_ = db.Get(&shipments, "SELECT COUNT(*) FROM shipments")
	pending, _ := store.PendingAfter(ctx, "orders", 0, 10)
	fmt.Println("shipments:", shipments, "pending:", len(pending))
	// Output: shipments: 1 pending: 0
}
