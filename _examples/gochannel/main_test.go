package main

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxtest"
)

// The service's wiring, tested without a database or a broker: the orders
// it publishes through the outbox are saved, and its ship_orders handler
// ships each once, however often the broker delivers it.
func TestShipOrdersShipsEachOrderOnce(t *testing.T) {
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	reg := outboxtest.NewRegistry(t, outbox.Tracked{Topic: "orders", Store: store})
	pub := outboxtest.NewPublisher(t, reg)

	for _, order := range []string{"order-1", "order-2", "order-3"} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order":%q}`, order)))
		if err := pub.Publish("orders", msg); err != nil {
			t.Fatal(err)
		}
	}
	outboxtest.RequirePending(t, store, "orders", 3)

	// A handler like the service's ship_orders.
	shipped := map[string]int{}
	shipOrders := func(msg *message.Message) error {
		shipped[msg.UUID]++
		return nil
	}
	for _, msg := range pub.Sent("orders") {
		for range 2 { // the broker delivers the message twice
			if got := outboxtest.Deliver(t, reg, "ship_orders", "orders", shipOrders, msg); !got.Acked {
				t.Fatalf("message %s was nacked: %v", msg.UUID, got.Err)
			}
		}
	}

	for _, rec := range outboxtest.RequirePublished(t, store, "orders") {
		if shipped[rec.UUID] != 1 {
			t.Errorf("order %s shipped %d times, want once", rec.Payload, shipped[rec.UUID])
		}
		outboxtest.RequireCompleted(t, store, rec.ID)
	}
	outboxtest.RequirePending(t, store, "orders", 0)
}
