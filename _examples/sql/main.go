// Command sql is a Watermill service on watermill-sql (v3) and PostgreSQL
// (POSTGRES_DSN) that adopted the outbox: the lines marked // outbox are all
// it took. It publishes three orders, ships them, and no record is left
// pending. The messages and the records share the service's database.
//
//	go run ./_examples/sql
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

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

	// Messages are rows of a table per topic; the JSON payload column wants
	// JSON payloads.
	db, err := sqlx.Open("pgx", cmp.Or(os.Getenv("POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
	if err != nil {
		return err
	}
	defer db.Close()
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{
		SchemaAdapter:        wsql.DefaultPostgreSQLSchema{},
		AutoInitializeSchema: true,
	}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:    "shipping",
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()

	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres(), DB: db}) // outbox
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
	// The topic table outlives the run, and a copy whose acknowledgement the
	// previous run's shutdown cut off comes again: the handler skips orders of
	// earlier runs.
	run := watermill.NewShortUUID()
	shipped := make(chan struct{}, 10)
	router.AddNoPublisherHandler("ship_orders", "orders", sub, func(msg *message.Message) error {
		if msg.Metadata.Get("run") != run {
			return nil
		}
		var order struct{ ID string }
		if err := json.Unmarshal(msg.Payload, &order); err != nil {
			return err
		}
		fmt.Println("shipped", order.ID)
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
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"id":%q}`, order)))
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
	fmt.Printf("sql: 3 orders shipped; %d records pending\n", status[0].Pending)
	if status[0].Pending != 0 {
		return errors.New("records left pending")
	}
	return nil
}
