package observe_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/outboxtest"
)

// countingObserver is an Observer that counts publishes and completions, as
// a metrics exporter would.
type countingObserver struct {
	published, completed atomic.Int64
}

func (o *countingObserver) Published(_ string, n int)            { o.published.Add(int64(n)) }
func (o *countingObserver) Completed(string, string)             { o.completed.Add(1) }
func (*countingObserver) DuplicateSkipped(string, string)        {}
func (*countingObserver) Failed(string, string)                  {}
func (*countingObserver) Abandoned(string, string)               {}
func (*countingObserver) Resent(string, observe.ResendKind, int) {}
func (*countingObserver) NotOwned(string, string)                {}
func (*countingObserver) UnknownRecord(string, string)           {}
func (*countingObserver) Mismatched(string, string)              {}

// One registry reports to two observers, for example the Prometheus
// collector of outboxmetrics and the OpenTelemetry metrics of outboxotel.
func ExampleObservers() {
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	reg, _ := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	prometheus, otel := &countingObserver{}, &countingObserver{}
	reg.SetObserver(observe.Observers(prometheus, otel))

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

	fmt.Println("prometheus:", prometheus.published.Load(), "published,", prometheus.completed.Load(), "completed")
	fmt.Println("otel:", otel.published.Load(), "published,", otel.completed.Load(), "completed")
	// Output:
	// prometheus: 1 published, 1 completed
	// otel: 1 published, 1 completed
}
