package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// README:begin adoption

// adoptOutbox adds the outbox to an existing service: its *sql.DB, its
// router, and the publisher its code publishes with. It returns the
// publisher to use from now on.
func adoptOutbox(ctx context.Context, db *sql.DB, router *message.Router, publisher message.Publisher, logger watermill.LoggerAdapter) (message.Publisher, error) {
	// The store wants sqlx's wrapper around the pool: sqlx.NewDb(db, driverName).
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: sqlx.NewDb(db, "sqlite")}) // or Postgres(), MySQL()
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil { // idempotent; safe from several instances
		return nil, err
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{
		Topic: "orders", Store: store,
		Consumers: []string{"ship", "stats"}, // the handlers that receive "orders"; omit for one receiver
	})
	if err != nil {
		return nil, err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, logger)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(mw)                                                             // checks and completes records
	router.AddPublisherDecorators(outbox.PublisherDecorator(reg))                        // records what handlers publish
	router.AddPlugin(outbox.ReplayPlugin(reg, publisher, outbox.ReplayConfig{}, logger)) // replays at start, resends what stays pending while running
	// The publisher for the service's code: a tracked topic gets a record first.
	return outbox.NewPublisher(reg, publisher)
}

// README:end adoption

// The adoption of the README, run on SQLite and GoChannel: two handlers
// receive "orders", and each handles every order.
func Example_adoption() {
	dir, err := os.MkdirTemp("", "outbox-adoption")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "service.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // SQLite: one writer

	// The service as it was: a pub/sub, a router with two handlers.
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex
	handled := map[string][]string{}
	done := make(chan struct{})
	record := func(consumer string) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			handled[consumer] = append(handled[consumer], string(msg.Payload))
			if len(handled["ship"])+len(handled["stats"]) == 4 {
				close(done)
			}
			return nil
		}
	}
	router.AddNoPublisherHandler("ship", "orders", pubSub, record("ship"))
	router.AddNoPublisherHandler("stats", "orders", pubSub, record("stats"))

	orders, err := adoptOutbox(context.Background(), db, router, pubSub, logger)
	if err != nil {
		panic(err)
	}
	go func() {
		if err := router.Run(context.Background()); err != nil {
			panic(err)
		}
	}()
	<-router.Running()
	for _, order := range []string{"order-1", "order-2"} {
		if err := orders.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(order))); err != nil {
			panic(err)
		}
	}
	<-done
	if err := router.Close(); err != nil {
		panic(err)
	}
	for _, consumer := range []string{"ship", "stats"} {
		sort.Strings(handled[consumer])
		fmt.Println(consumer, handled[consumer])
	}
	// Output:
	// ship [order-1 order-2]
	// stats [order-1 order-2]
}
