package outboxtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxtest"
)

// placeOrder is the service's publishing code under test: it publishes
// through whatever publisher the service wires in, the outbox publisher in
// production.
func placeOrder(pub message.Publisher, order string) error {
	payload, err := json.Marshal(map[string]string{"order": order})
	if err != nil {
		return err
	}
	return pub.Publish("orders", message.NewMessage(watermill.NewUUID(), payload))
}

// shipOrder is the service's handler under test, added to its router as
// "ship_orders" on the topic "orders".
func shipOrder(msg *message.Message) error {
	var order map[string]string
	if err := json.Unmarshal(msg.Payload, &order); err != nil {
		return err
	}
	fmt.Println("shipped", order["order"])
	return nil
}

// A unit test of a service's publisher and handler: what the publisher
// saves, and that the handler completes the record and runs once however
// often the message comes.
func Example() {
	// In a real test, t is the test's *testing.T (and the test may be
	// parallel: NewRegistry changes no environment variable).
	t := &testing.T{}

	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	reg := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store})
	pub := outboxtest.NewPublisher(t, reg)

	if err := placeOrder(pub, "order-1"); err != nil {
		t.Fatal(err)
	}
	recs := outboxtest.RequirePublished(t, store, "orders")
	fmt.Println("saved", string(recs[0].Payload))

	msg := pub.Sent("orders")[0]
	got := outboxtest.Deliver(t, reg, "ship_orders", "orders", shipOrder, msg)
	fmt.Println("acked:", got.Acked, "handler runs:", got.Runs)
	outboxtest.RequireCompleted(t, store, recs[0].ID)

	// The broker delivers the message again: the outbox acks the copy
	// without running the handler.
	again := outboxtest.Deliver(t, reg, "ship_orders", "orders", shipOrder, msg)
	fmt.Println("copy acked:", again.Acked, "handler runs:", again.Runs)
	outboxtest.RequirePending(t, store, "orders", 0)

	// Output:
	// saved {"order":"order-1"}
	// shipped order-1
	// acked: true handler runs: 1
	// copy acked: true handler runs: 0
}

// A test of what the service does with a message its handler cannot take:
// with the service's MaxAttempts of 1, the first failure abandons the
// record, calls OnAbandon and returns the [*outbox.AbandonedError] (a
// PoisonQueue outside the outbox middleware would take the message from
// there).
func ExampleDeliverWith() {
	t := &testing.T{} // in a real test, the test's *testing.T

	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	reg := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store})
	pub := outboxtest.NewPublisher(t, reg)
	if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("not json"))); err != nil {
		t.Fatal(err)
	}

	cfg := outbox.MiddlewareConfig{
		MaxAttempts: 1,
		OnAbandon: func(msg *message.Message, err *outbox.AbandonedError) {
			fmt.Println("abandoned after", err.Attempts, "attempt")
		},
	}
	got := outboxtest.DeliverWith(t, reg, cfg, "ship_orders", "orders", shipOrder, pub.Sent("orders")[0])
	var abandoned *outbox.AbandonedError
	fmt.Println("acked:", got.Acked, "abandoned:", errors.As(got.Err, &abandoned))
	rec := outboxtest.RequirePublished(t, store, "orders")[0]
	outboxtest.RequireAbandoned(t, store, rec.ID)

	// Output:
	// abandoned after 1 attempt
	// acked: false abandoned: true
}

// RequirePublished with matchers returns the records of the topic that
// have a payload and a metadata value, and fails the test when none has.
func ExampleRequirePublished() {
	t := &testing.T{} // in a real test, the test's *testing.T

	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	reg := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store})
	pub := outboxtest.NewPublisher(t, reg)
	for _, region := range []string{"eu", "us"} {
		msg := message.NewMessage(watermill.NewUUID(), []byte("order-"+region))
		msg.Metadata.Set("region", region)
		if err := pub.Publish("orders", msg); err != nil {
			t.Fatal(err)
		}
	}

	recs := outboxtest.RequirePublished(t, store, "orders",
		outboxtest.WithMetadata("region", "us"), outboxtest.WithPayload([]byte("order-us")))
	fmt.Println(len(recs), string(recs[0].Payload))

	// Output:
	// 1 order-us
}

// Deliver's outcome says whether the outbox tracked the delivery. A
// handler name that is not one of the topic's declared consumers runs
// untracked, leaving the record pending: Deliver then fails the test and
// names the fix.
func ExampleOutcome_tracked() {
	t := &testing.T{} // in a real test, the test's *testing.T

	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	reg := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store, Consumers: []string{"ship", "stats"}})
	pub := outboxtest.NewPublisher(t, reg)
	if err := placeOrder(pub, "order-1"); err != nil {
		t.Fatal(err)
	}

	got := outboxtest.Deliver(t, reg, "ship", "orders", shipOrder, pub.Sent("orders")[0])
	fmt.Println("acked:", got.Acked, "tracked:", got.Tracked)

	// Output:
	// shipped order-1
	// acked: true tracked: true
}

// DeliverProducing drives a handler that returns messages: the router
// publishes them through the outbox's publisher decorator, so a tracked
// topic gets a record of each, and the delivery completes once they are
// published.
func ExampleDeliverProducing() {
	t := &testing.T{} // in a real test, the test's *testing.T

	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	reg := outboxtest.NewRegistry(t,
		outbox.Tracked{Topic: "orders", Store: store},
		outbox.Tracked{Topic: "shipments", Store: store})
	pub := outboxtest.NewPublisher(t, reg)
	if err := placeOrder(pub, "order-1"); err != nil {
		t.Fatal(err)
	}

	ship := func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("shipment of "+string(msg.Payload)))}, nil
	}
	got := outboxtest.DeliverProducing(t, reg, "ship_orders", "orders", "shipments", ship, pub.Sent("orders")[0])
	fmt.Println("acked:", got.Acked, "produced:", len(got.Produced))
	shipment := outboxtest.RequirePublished(t, store, "shipments")[0]
	fmt.Println(string(shipment.Payload))
	outboxtest.RequirePending(t, store, "orders", 0)

	// Output:
	// acked: true produced: 1
	// shipment of {"order":"order-1"}
}

// The in-memory store joins an outboxtest.Tx: records that
// outbox.TxPublisher saves in it appear at Commit and vanish at Rollback.
func ExampleStore_InsertTx() {
	t := &testing.T{} // in a real test, the test's *testing.T

	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	reg := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store})
	broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer broker.Close()
	txPub, err := outbox.NewTxPublisher(reg, broker)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	rolledBack := txPub.Wrap(outboxtest.NewTx())
	if err := rolledBack.Publish(ctx, "orders", message.NewMessage(watermill.NewUUID(), []byte("order-1"))); err != nil {
		t.Fatal(err)
	}
	fmt.Println("before rollback:", len(store.Records("orders")))
	_ = rolledBack.Rollback()
	fmt.Println("after rollback:", len(store.Records("orders")))

	committed := txPub.Wrap(outboxtest.NewTx())
	if err := committed.Publish(ctx, "orders", message.NewMessage(watermill.NewUUID(), []byte("order-2"))); err != nil {
		t.Fatal(err)
	}
	if err := committed.Commit(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("after commit:", string(outboxtest.RequirePending(t, store, "orders", 1)[0].Payload))

	// Output:
	// before rollback: 0
	// after rollback: 0
	// after commit: order-2
}

// A handler that completes its record in its own transaction
// (outbox.CompleteTx): the record is complete once the transaction
// commits, and stays pending when it rolls back. The store's clock
// (StoreConfig.Now) moves past the failure's retry delay.
func ExampleStore_CompleteTx() {
	t := &testing.T{} // in a real test, the test's *testing.T

	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store := outboxtest.NewStore(outboxtest.StoreConfig{Now: func() time.Time { return now }})
	reg := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store})
	pub := outboxtest.NewPublisher(t, reg)
	if err := placeOrder(pub, "order-1"); err != nil {
		t.Fatal(err)
	}
	inTx := func(commit bool) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			tx := outboxtest.NewTx()
			if err := outbox.CompleteTx(msg.Context(), tx, msg); err != nil {
				return err
			}
			if !commit {
				_ = tx.Rollback()
				return errors.New("business write failed")
			}
			return tx.Commit()
		}
	}
	msg := pub.Sent("orders")[0]
	failed := outboxtest.Deliver(t, reg, "ship_orders", "orders", inTx(false), msg)
	fmt.Println("rolled back: acked", failed.Acked, "pending", len(outboxtest.RequirePending(t, store, "orders", 1)))
	now = now.Add(time.Minute) // past the retry delay of the failure
	done := outboxtest.Deliver(t, reg, "ship_orders", "orders", inTx(true), msg)
	fmt.Println("committed: acked", done.Acked, "pending", len(outboxtest.RequirePending(t, store, "orders", 0)))

	// Output:
	// rolled back: acked false pending 1
	// committed: acked true pending 0
}
