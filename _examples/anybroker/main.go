// Command anybroker is one service whose pub/sub is chosen at startup, by
// the -broker flag or the OUTBOX_BROKER environment variable: gochannel,
// sql, amqp, kafka, nats or redis. The handler and the publishing code are
// the same for all of them; only the constructor of the pub/sub differs
// (brokers.go).
//
//	go run ./_examples/anybroker -broker nats
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmoutbox/outbox"
)

const topic = "orders"

func main() {
	broker := flag.String("broker", envOr("OUTBOX_BROKER", "gochannel"), "pub/sub: "+strings.Join(brokerNames(), "|"))
	flag.Parse()
	if err := run(*broker); err != nil {
		log.Fatal(err)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(broker string) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := watermill.NewStdLogger(false, false)

	// The only line that depends on the broker.
	conn, err := connect(ctx, broker, logger)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, conn.close()) }()

	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: conn.store}) // outbox
	if err != nil {
		return err
	}

	// The service's router, as it was, plus the outbox's three lines.
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, logger) // outbox
	if err != nil {
		return err
	}
	router.AddMiddleware(mw)                                                            // outbox
	router.AddPlugin(outbox.ReplayPlugin(reg, conn.pub, outbox.ReplayConfig{}, logger)) // outbox
	router.AddMiddleware(middleware.Recoverer)
	shipping := newShipping()
	router.AddNoPublisherHandler("ship_orders", topic, conn.sub, shipping.ship)

	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return err
	}

	// The service's publishing code, now through the outbox publisher.
	orders, err := outbox.NewPublisher(conn.pub, reg) // outbox
	if err != nil {
		return err
	}
	if err := placeOrders(orders, shipping.run, "order-1", "order-2", "order-3"); err != nil {
		return err
	}

	if err := shipping.wait(ctx, 3); err != nil {
		return err
	}
	// Close waits for the running handlers, so every record is completed.
	if err := errors.Join(router.Close(), <-runErr); err != nil {
		return err
	}
	return report(ctx, broker, reg, 3)
}

// placeOrders is the service's publishing code. Each order carries the id
// of the run that placed it.
func placeOrders(pub message.Publisher, run string, names ...string) error {
	for _, name := range names {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order":%q}`, name)))
		msg.Metadata.Set("run", run)
		if err := pub.Publish(topic, msg); err != nil {
			return err
		}
	}
	return nil
}

// shipping is the service's handler: it ships the orders of this run. Most
// brokers keep messages between runs and may deliver an earlier run's order
// again (NATS reads the whole stream again, as the subscriber deletes the
// durable consumer it created); those are skipped.
type shipping struct {
	run     string
	shipped chan struct{}
}

func newShipping() *shipping {
	return &shipping{run: watermill.NewShortUUID(), shipped: make(chan struct{}, 10)}
}

func (s *shipping) ship(msg *message.Message) error {
	if msg.Metadata.Get("run") != s.run {
		return nil
	}
	var order struct{ Order string }
	if err := json.Unmarshal(msg.Payload, &order); err != nil {
		return err
	}
	fmt.Println("shipped", order.Order)
	s.shipped <- struct{}{}
	return nil
}

// wait returns once n orders of this run were shipped.
func (s *shipping) wait(ctx context.Context, n int) error {
	for i := range n {
		select {
		case <-s.shipped:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d orders shipped: %w", i, n, ctx.Err())
		}
	}
	return nil
}

// report prints the final line from the outbox's own status.
func report(ctx context.Context, broker string, reg *outbox.Registry, shipped int) error {
	status, err := outbox.ReadStatus(ctx, reg, false)
	if err != nil {
		return err
	}
	var pending int64
	for _, st := range status {
		pending += st.Pending
	}
	fmt.Printf("%s: %d orders shipped; %d records pending\n", broker, shipped, pending)
	if pending != 0 {
		return errors.New("records left pending")
	}
	return nil
}
