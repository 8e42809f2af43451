// Command amqp is the shop service on watermill-amqp (v2) and RabbitMQ
// (AMQP_URI) with the outbox adopted: the lines marked // outbox are all it
// took. It publishes three orders, ships them, and no record is left pending.
//
//	go run ./_examples/amqp
package main

import (
	"cmp"
	"context"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/_examples/shop"
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

	db, err := shop.SQLite("amqp")
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db}) // outbox
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil { // outbox
		return err
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: shop.Topic, Store: store}) // outbox
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
	orders, err := outbox.NewPublisher(reg, pub)                                   // outbox
	if err != nil {
		return err
	}
	return shop.Run(ctx, "amqp", router, sub, orders, reg)
}
