// Command gochannel is the shop service on GoChannel, the in-process
// pub/sub, with the outbox adopted: the lines marked // outbox are all it
// took. It publishes three orders, ships them, and no record is left pending.
//
//	go run ./_examples/gochannel
package main

import (
	"context"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

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
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer pubSub.Close()

	db, err := shop.SQLite("gochannel")
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
	router.AddMiddleware(mw)                                                          // outbox
	router.AddPlugin(outbox.ReplayPlugin(reg, pubSub, outbox.ReplayConfig{}, logger)) // outbox
	orders, err := outbox.NewPublisher(reg, pubSub)                                   // outbox
	if err != nil {
		return err
	}
	return shop.Run(ctx, "gochannel", router, pubSub, orders, reg)
}
