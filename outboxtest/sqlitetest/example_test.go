package sqlitetest_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxtest"
	"github.com/wmoutbox/outbox/outboxtest/sqlitetest"
)

// invoices is the receiving service's business table.
const invoices = "CREATE TABLE invoices (order_uuid TEXT NOT NULL, payload TEXT NOT NULL)"

// invoice is the handler under test of the billing service, which receives
// another service's "orders": it records the message in its inbox and
// writes the invoice in one transaction, so that both commit or neither.
func invoice(db *sqlitetest.DB) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
		switch err := outbox.InboxTx(ctx, tx, msg); {
		case errors.Is(err, outbox.ErrAlreadyHandled):
			return nil // another copy did it
		case err != nil:
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_uuid, payload) VALUES (?, ?)", msg.UUID, string(msg.Payload)); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// A test of a receiver whose handler writes its effect in the transaction
// of its inbox entry (outbox.InboxTx), in process: the sending service's
// message comes from the outboxtest kit, the receiving service's database
// is an SQLite file. Two copies of the message make one invoice.
func Example_transactionalReceiver() {
	t := &testing.T{} // in a real test, the test's *testing.T

	// The sending service publishes an order.
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	pub := outboxtest.NewPublisher(t, outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store}))
	if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("order-1"))); err != nil {
		t.Fatal(err)
	}
	msg := pub.Sent("orders")[0]

	// The receiving service: its database with an inbox, and a registry
	// that tracks nothing of its own.
	db := sqlitetest.Open(t, invoices)
	defer os.RemoveAll(filepath.Dir(db.Path)) // a real test's cleanup does these
	defer db.Close()
	receiver := outboxtest.NewRegistry(t)
	cfg := outbox.MiddlewareConfig{Inbox: db.Inbox}

	for range 2 { // the broker delivers the message twice
		got := outboxtest.DeliverWith(t, receiver, cfg, "billing", "orders", invoice(db), msg)
		fmt.Println("acked:", got.Acked, "handler runs:", got.Runs)
	}
	var n int
	if err := db.Get(&n, "SELECT COUNT(*) FROM invoices"); err != nil {
		t.Fatal(err)
	}
	fmt.Println("invoices:", n, "handled by billing:", len(db.Handled(t, "billing")))

	// Output:
	// acked: true handler runs: 1
	// acked: true handler runs: 0
	// invoices: 1 handled by billing: 1
}
