// Command amqp is a Watermill service on watermill-amqp (v2) and RabbitMQ
// (AMQP_URI) that adopted the outbox: the lines marked // outbox are all it
// took. It publishes three orders, ships them, and no record is left pending.
//
//	go run ./_examples/amqp
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
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
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

	// An exchange per topic and a durable queue per topic and consumer group,
	// bound when the router subscribes; the replay plugin sends after that.
	config := amqp.NewDurablePubSubConfig(
		cmp.Or(os.Getenv("AMQP_URI"), "amqp://guest:guest@127.0.0.1:5672/"),
		amqp.GenerateQueueNameTopicNameWithSuffix("shipping"),
	)
	pub, err := amqp.NewPublisher(config, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := amqp.NewSubscriber(config, logger)
	if err != nil {
		return err
	}
	defer sub.Close()

	// The service's database: a SQLite file, removed first (with its WAL files)
	// so that every run starts clean.
	file := filepath.Join(os.TempDir(), "outbox-example-amqp.db")
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
	// The queue outlives the run, and a copy whose acknowledgement the
	// previous run's shutdown cut off comes again: the handler skips orders of
	// earlier runs.
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
	fmt.Printf("amqp: 3 orders shipped; %d records pending\n", status[0].Pending)
	if status[0].Pending != 0 {
		return errors.New("records left pending")
	}
	return nil
}
