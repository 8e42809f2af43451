// Command nats is a Watermill service on watermill-nats (v2) and NATS
// JetStream (NATS_URL) that adopted the outbox: the lines marked // outbox are
// all it took. It publishes three orders, ships them, and no record is left
// pending.
//
//	go run ./_examples/nats
package main

import (
	"cmp"
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

	// A stream per topic, created on first use, and a durable consumer per
	// topic and group that starts at the stream's first message, so a
	// consumer created at startup still gets what replay sent.
	url := cmp.Or(os.Getenv("NATS_URL"), "nats://127.0.0.1:4222")
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

	// The service's database: a SQLite file, removed first (with its WAL files)
	// so that every run starts clean.
	file := filepath.Join(os.TempDir(), "outbox-example-nats.db")
	for _, f := range []string{file, file + "-wal", file + "-shm"} {
		if err := os.RemoveAll(f); err != nil {
			return err
		}
	}
	db, err := sqlx.Open("sqlite", "file:"+file+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // SQLite has one writer

	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db}) // outbox
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil { // outbox
		return err
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store}) // outbox
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, logger) // outbox
	if err != nil {
		return err
	}
	router.AddMiddleware(mw)                                                       // outbox
	router.AddPlugin(outbox.ReplayPlugin(reg, pub, outbox.ReplayConfig{}, logger)) // outbox
	// The subscriber deletes the durable consumer it created when it closes,
	// so every run reads the stream from its first message again: the handler
	// skips orders of earlier runs.
	run := watermill.NewShortUUID()
	shipped := make(chan struct{}, 10)
	router.AddNoPublisherHandler("ship_orders", "orders", sub, func(msg *message.Message) error {
		if msg.Metadata.Get("run") != run {
			return nil
		}
		fmt.Printf("shipped %s\n", msg.Payload)
		shipped <- struct{}{}
		return nil
	})
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return err
	}

	orders, err := outbox.NewPublisher(pub, reg) // outbox
	if err != nil {
		return err
	}
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(order))
		msg.Metadata.Set("run", run)
		if err := orders.Publish("orders", msg); err != nil {
			return err
		}
	}
	for range 3 {
		select {
		case <-shipped:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the orders to ship: %w", ctx.Err())
		}
	}
	// Close waits for the running handlers, so their records are completed.
	if err := errors.Join(router.Close(), <-runErr); err != nil {
		return err
	}

	status, err := outbox.ReadStatus(ctx, reg, false)
	if err != nil {
		return err
	}
	fmt.Printf("nats: 3 orders shipped; %d records pending\n", status[0].Pending)
	if status[0].Pending != 0 {
		return errors.New("records left pending")
	}
	return nil
}
