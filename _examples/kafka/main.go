// Command kafka is the shop service on watermill-kafka (v3) with the outbox
// adopted: the lines marked // outbox are all it took. It publishes three
// orders, ships them, and no record is left pending. Without KAFKA_BROKERS it
// starts an in-process broker that speaks the Kafka protocol (kfake).
//
//	go run ./_examples/kafka
package main

import (
	"context"
	"log"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

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

	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	if brokers[0] == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
		if err != nil {
			return err
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
	}

	// The one setting the outbox needs: Subscribe returns before the group
	// has joined, so a group that is new at startup must start at the oldest
	// offset, or it skips what replay sent meanwhile.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:   brokers,
		Marshaler: kafka.DefaultMarshaler{},
	}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	saramaConfig := kafka.DefaultSaramaSubscriberConfig()
	saramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: saramaConfig,
		ConsumerGroup:         "shipping",
	}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()

	db, err := shop.SQLite("kafka")
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
	return shop.Run(ctx, "kafka", router, sub, orders, reg)
}
