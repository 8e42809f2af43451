package outbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxops"
)

// A message whose handler keeps failing is abandoned after three tries and
// diverted to a poison topic; its record is kept, no longer pending, and can
// be resubmitted once the cause is fixed.
func ExampleMiddlewareConfig_maxAttempts() {
	store, cleanup := exampleStore()
	defer cleanup()
	reg, _ := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	poisoned, _ := pubSub.Subscribe(context.Background(), "orders_poison")

	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	poison, _ := middleware.PoisonQueueWithFilter(pubSub, "orders_poison", outbox.IsAbandoned)
	mw, _ := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{MaxAttempts: 3}, nil)
	router.AddMiddleware(poison, mw) // the poison queue outside the outbox middleware
	tries := 0
	router.AddNoPublisherHandler("ship", "orders", pubSub, func(*message.Message) error {
		tries++
		return errors.New("warehouse unreachable")
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	pub, _ := outbox.NewPublisher(reg, pubSub)
	_ = pub.Publish("orders", message.NewMessage("order-3", []byte("order 3")))
	msg := <-poisoned
	msg.Ack()
	_ = router.Close()

	status, _ := outboxops.ReadStatus(context.Background(), reg, outboxops.StatusOptions{Full: true})
	fmt.Println(msg.UUID, "after", tries, "tries:", msg.Metadata.Get(middleware.ReasonForPoisonedKey))
	fmt.Printf("pending %d, abandoned %d\n", status[0].Pending, status[0].Abandoned)
	// Output:
	// order-3 after 3 tries: outbox: record 1 of "orders" abandoned after 3 failed attempt(s): warehouse unreachable
	// pending 0, abandoned 1
}
