// Command kafka is a Watermill service on watermill-kafka (v3) that adopted
// the outbox: the lines marked // outbox are all it took. It publishes three
// orders, ships them, and no record is left pending. Without KAFKA_BROKERS it
// starts an in-process broker that speaks the Kafka protocol (kfake).
//
//	go run ./_examples/kafka
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kfake"
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

	// The service's database: a SQLite file, removed first (with its WAL files)
	// so that every run starts clean.
	file := filepath.Join(os.TempDir(), "outbox-example-kafka.db")
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
	// A broker given by KAFKA_BROKERS keeps what earlier runs sent and may
	// deliver some of it again: the handler skips orders of earlier runs.
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
	fmt.Printf("kafka: 3 orders shipped; %d records pending\n", status[0].Pending)
	if status[0].Pending != 0 {
		return errors.New("records left pending")
	}
	return nil
}
