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
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
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

func run(broker string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := watermill.NewStdLogger(false, false)

	// The only line that depends on the broker.
	conn, err := connect(ctx, broker, logger)
	if err != nil {
		return err
	}
	defer conn.close()

	// outbox: the tracked topic and the table its records go to.
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: conn.store})
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
	uuids, err := placeOrders(orders, "order-1", "order-2", "order-3")
	if err != nil {
		return err
	}

	if err := shipping.wait(ctx, uuids); err != nil {
		return err
	}
	// Close waits for the running handlers, so every record is completed.
	if err := router.Close(); err != nil {
		return err
	}
	if err := <-runErr; err != nil {
		return err
	}
	return report(ctx, broker, conn, shipping, uuids)
}

// placeOrders is the service's publishing code.
func placeOrders(pub message.Publisher, names ...string) ([]string, error) {
	uuids := make([]string, len(names))
	for i, name := range names {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order":%q}`, name)))
		if err := pub.Publish(topic, msg); err != nil {
			return nil, err
		}
		uuids[i] = msg.UUID
	}
	return uuids, nil
}

// shipping is the service's handler: it ships an order, and counts how many
// times it ran for each message so the example can show each ran once.
type shipping struct {
	mu      sync.Mutex
	runs    map[string]int // handler runs by message UUID
	changed chan struct{}
}

func newShipping() *shipping {
	return &shipping{runs: map[string]int{}, changed: make(chan struct{}, 1)}
}

func (s *shipping) ship(msg *message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs[msg.UUID]++
	fmt.Printf("shipped %s\n", msg.Payload)
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

// wait returns once every message was shipped.
func (s *shipping) wait(ctx context.Context, uuids []string) error {
	for {
		s.mu.Lock()
		done := 0
		for _, u := range uuids {
			if s.runs[u] > 0 {
				done++
			}
		}
		s.mu.Unlock()
		if done == len(uuids) {
			return nil
		}
		select {
		case <-s.changed:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d orders shipped: %w", done, len(uuids), ctx.Err())
		}
	}
}

func report(ctx context.Context, broker string, conn *connection, s *shipping, uuids []string) error {
	pending, err := conn.store.PendingAfter(ctx, topic, 0, 1000)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	once := true
	for _, u := range uuids {
		once = once && s.runs[u] == 1
	}
	fmt.Printf("%s: %d orders shipped, each once: %v; %d records pending\n", broker, len(uuids), once, len(pending))
	if !once || len(pending) != 0 {
		return errors.New("the outbox did not deliver every order exactly once")
	}
	return nil
}
