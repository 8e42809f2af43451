// Command redis is the shop service on watermill-redisstream and Redis
// Streams (REDIS_ADDR) with the outbox adopted: the lines marked // outbox
// are all it took. It publishes three orders, ships them, and no record is
// left pending.
//
//	go run ./_examples/redis
package main

import (
	"cmp"
	"context"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

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

	// A consumer group starts at the stream's first entry (the default
	// OldestId, "0"), so a group created at startup still gets what replay sent.
	addr := cmp.Or(os.Getenv("REDIS_ADDR"), "127.0.0.1:6379")
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client: redis.NewClient(&redis.Options{Addr: addr}),
	}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        redis.NewClient(&redis.Options{Addr: addr}),
		ConsumerGroup: "shipping",
	}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()

	db, err := shop.SQLite("redis")
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
	return shop.Run(ctx, "redis", router, sub, orders, reg)
}
