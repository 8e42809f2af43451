// Command nats adopts the outbox into an existing Watermill service on
// watermill-nats (v2) and NATS JetStream (NATS_URL): the service publishes
// three orders through the outbox publisher, its router ships each once, and
// every record ends completed. The records live in a SQLite file.
//
//	go run ./_examples/nats
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	_ "modernc.org/sqlite"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := watermill.NewStdLogger(false, false)

	// The service's pub/sub, as it was: a stream per topic, created on first
	// use, and a durable consumer per topic and group that starts at the
	// stream's first message, so a consumer created at startup still gets
	// what replay sent.
	url := envOr("NATS_URL", "nats://127.0.0.1:4222")
	jetStream := wnats.JetStreamConfig{
		AutoProvision:     true,
		SubscribeOptions:  []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit()},
		DurablePrefix:     "shipping",
		DurableCalculator: func(prefix, topic string) string { return prefix + "_" + topic },
	}
	pub, err := wnats.NewPublisher(wnats.PublisherConfig{
		URL:       url,
		Marshaler: &wnats.NATSMarshaler{},
		JetStream: jetStream,
	}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := wnats.NewSubscriber(wnats.SubscriberConfig{
		URL:              url,
		QueueGroupPrefix: "shipping",
		Unmarshaler:      &wnats.NATSMarshaler{},
		JetStream:        jetStream,
	}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()

	// outbox: the tracked topic and the table its records go to.
	db, err := sqlx.Open("sqlite", "file:"+filepath.Join(os.TempDir(), "outbox-example-nats.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
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
	router.AddMiddleware(mw)                                                       // outbox
	router.AddPlugin(outbox.ReplayPlugin(reg, pub, outbox.ReplayConfig{}, logger)) // outbox: replays with the undecorated publisher
	router.AddMiddleware(middleware.Recoverer)
	shipped := make(chan string, 100)
	router.AddNoPublisherHandler("ship_orders", "orders", sub, func(msg *message.Message) error {
		fmt.Printf("shipped %s\n", msg.Payload)
		shipped <- msg.UUID
		return nil
	})
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return err
	}

	// The service's publishing code, now through the outbox publisher.
	orders, err := outbox.NewPublisher(pub, reg) // outbox
	if err != nil {
		return err
	}
	runs := map[string]int{}
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order":%q}`, order)))
		if err := orders.Publish("orders", msg); err != nil {
			return err
		}
		runs[msg.UUID] = 0
	}

	// Wait for the three orders, then stop: Close waits for the running
	// handlers, so their records are completed.
	for shippedOnce := 0; shippedOnce < len(runs); {
		select {
		case uuid := <-shipped:
			if n, ours := runs[uuid]; ours {
				runs[uuid] = n + 1
				if n == 0 {
					shippedOnce++
				}
			}
		case <-ctx.Done():
			return errors.New("timed out waiting for the orders to ship")
		}
	}
	if err := router.Close(); err != nil {
		return err
	}
	if err := <-runErr; err != nil {
		return err
	}
	for len(shipped) > 0 {
		if uuid := <-shipped; runs[uuid] > 0 {
			runs[uuid]++
		}
	}

	pending, err := store.PendingAfter(ctx, "orders", 0, 1000)
	if err != nil {
		return err
	}
	once := true
	for _, n := range runs {
		once = once && n == 1
	}
	fmt.Printf("nats: %d orders shipped, each once: %v; %d records pending\n", len(runs), once, len(pending))
	if !once || len(pending) != 0 {
		return errors.New("the outbox did not deliver every order exactly once")
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
