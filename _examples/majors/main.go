// Command majors is the service of the sql and amqp examples on the current
// majors of their pub/subs, chosen by -broker: watermill-sql v4 on
// PostgreSQL (sqlv4, the default) or watermill-amqp v3 on RabbitMQ (amqpv3).
// The lines marked // outbox are the same as on v3 and v2; only the pub/sub's
// constructor differs. The records are in the service's PostgreSQL
// (POSTGRES_DSN), beside the messages with sqlv4.
//
//	go run ./_examples/majors -broker amqpv3
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/_examples/shop"
	"github.com/wmoutbox/outbox/sqlstore"
)

func main() {
	broker := flag.String("broker", "sqlv4", "pub/sub: sqlv4|amqpv3")
	flag.Parse()
	if err := run(*broker); err != nil {
		log.Fatal(err)
	}
}

// pubSub builds the broker's publisher and subscriber; db is the service's
// database, which watermill-sql v4 takes through its own Beginner interface.
func pubSub(broker string, db *sqlx.DB, logger watermill.LoggerAdapter) (message.Publisher, message.Subscriber, error) {
	switch broker {
	case "sqlv4":
		// Messages are rows of a table per topic, the same tables as v3's.
		beginner := wsql.BeginnerFromStdSQL(db)
		pub, err := wsql.NewPublisher(beginner, wsql.PublisherConfig{
			SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true,
		}, logger)
		if err != nil {
			return nil, nil, err
		}
		sub, err := wsql.NewSubscriber(beginner, wsql.SubscriberConfig{
			ConsumerGroup:  "shipping",
			SchemaAdapter:  wsql.DefaultPostgreSQLSchema{},
			OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true,
		}, logger)
		if err != nil {
			return nil, nil, errors.Join(err, pub.Close())
		}
		return pub, sub, nil
	case "amqpv3":
		// An exchange per topic and a durable queue per topic and consumer
		// group, bound when the router subscribes; the replay plugin sends
		// after that.
		config := amqp.NewDurablePubSubConfig(
			cmp.Or(os.Getenv("AMQP_URI"), "amqp://guest:guest@127.0.0.1:5672/"),
			amqp.GenerateQueueNameTopicNameWithSuffix("shipping"),
		)
		pub, err := amqp.NewPublisher(config, logger)
		if err != nil {
			return nil, nil, err
		}
		sub, err := amqp.NewSubscriber(config, logger)
		if err != nil {
			return nil, nil, errors.Join(err, pub.Close())
		}
		return pub, sub, nil
	}
	return nil, nil, fmt.Errorf("unknown broker %q, want sqlv4 or amqpv3", broker)
}

func run(broker string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := watermill.NewStdLogger(false, false)

	db, err := sqlx.Open("pgx", cmp.Or(os.Getenv("POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
	if err != nil {
		return err
	}
	defer db.Close()
	pub, sub, err := pubSub(broker, db, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	defer sub.Close()

	// The records go through sqlstore on the *sqlx.DB, whichever major publishes.
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres(), DB: db}) // outbox
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
	return shop.Run(ctx, broker, router, sub, orders, reg)
}
