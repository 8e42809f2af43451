// Command gochannel is a Watermill service on GoChannel, the in-process
// pub/sub, that adopted the outbox: the lines marked // outbox are all it took.
// It publishes three orders, ships them, and no record is left pending.
//
//	go run ./_examples/gochannel
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
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
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
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer pubSub.Close()

	// The service's database: a SQLite file, removed first (with its WAL files)
	// so that every run starts clean.
	file := filepath.Join(os.TempDir(), "outbox-example-gochannel.db")
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
	router.AddMiddleware(mw)                                                          // outbox
	router.AddPlugin(outbox.ReplayPlugin(reg, pubSub, outbox.ReplayConfig{}, logger)) // outbox
	shipped := make(chan struct{}, 10)
	router.AddNoPublisherHandler("ship_orders", "orders", pubSub, func(msg *message.Message) error {
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

	pub, err := outbox.NewPublisher(pubSub, reg) // outbox
	if err != nil {
		return err
	}
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(order))); err != nil {
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
	fmt.Printf("gochannel: 3 orders shipped; %d records pending\n", status[0].Pending)
	if status[0].Pending != 0 {
		return errors.New("records left pending")
	}
	return nil
}
