package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

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

// countingObserver is an Observer that counts publishes and handlings, as
// a metrics exporter would.
type countingObserver struct {
	published, handled atomic.Int64
}

func (o *countingObserver) Published(_ string, n int)           { o.published.Add(int64(n)) }
func (o *countingObserver) Handled(string, string)              { o.handled.Add(1) }
func (*countingObserver) DuplicateSkipped(string, string)       {}
func (*countingObserver) Failed(string, string)                 {}
func (*countingObserver) Abandoned(string, string)              {}
func (*countingObserver) Resent(string, outbox.ResendKind, int) {}
func (*countingObserver) NotOwned(string, string)               {}
func (*countingObserver) UnknownRecord(string, string)          {}
func (*countingObserver) Mismatched(string, string)             {}

// One registry reports to two observers, for example the Prometheus
// collector of outboxmetrics and the OpenTelemetry metrics of outboxotel.
func ExampleObservers() {
	store, cleanup := exampleStore()
	defer cleanup()
	reg, _ := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	prometheus, otel := &countingObserver{}, &countingObserver{}
	reg.SetObserver(outbox.Observers(prometheus, otel))

	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	mw, _ := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	router.AddMiddleware(mw)
	handled := make(chan struct{})
	router.AddNoPublisherHandler("ship", "orders", pubSub, func(*message.Message) error {
		close(handled)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	pub, _ := outbox.NewPublisher(reg, pubSub)
	_ = pub.Publish("orders", message.NewMessage("order-4", []byte("order 4")))
	<-handled
	_ = router.Close()                            // returns once the handlers returned
	_ = reg.WaitCompletions(context.Background()) // and once the completions in the background ran

	fmt.Println("prometheus:", prometheus.published.Load(), "published,", prometheus.handled.Load(), "handled")
	fmt.Println("otel:", otel.published.Load(), "published,", otel.handled.Load(), "handled")
	// Output:
	// prometheus: 1 published, 1 handled
	// otel: 1 published, 1 handled
}
