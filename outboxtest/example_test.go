package outboxtest_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

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
