// Command nats is the shop service on watermill-nats (v2) and NATS
// JetStream (NATS_URL) with the outbox adopted: the lines marked // outbox
// are all it took. It publishes three orders, ships them, and no record is
// left pending.
//
//	go run ./_examples/nats
package main

import (
	"cmp"
	"context"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

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

	db, err := shop.SQLite("nats")
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
	return shop.Run(ctx, "nats", router, sub, orders, reg)
}
