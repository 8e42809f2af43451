package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/wmoutbox/outbox/_examples/shop"
	"github.com/wmoutbox/outbox/sqlstore"
)

// group is the service's consumer group, durable consumer or queue suffix.
const group = "shipping"

// connection is a pub/sub and the record store of the service.
type connection struct {
	pub     message.Publisher
	sub     message.Subscriber
	store   *sqlstore.Store
	closers []func() error
}

// close closes everything in the reverse order of opening.
func (c *connection) close() error {
	var errs []error
	for i := len(c.closers) - 1; i >= 0; i-- {
		errs = append(errs, c.closers[i]())
	}
	return errors.Join(errs...)
}

// brokers builds each pub/sub. Addresses come from the environment, with
// the local defaults.
var brokers = map[string]func(c *connection, logger watermill.LoggerAdapter) error{
	"gochannel": func(c *connection, logger watermill.LoggerAdapter) error {
		gc := gochannel.NewGoChannel(gochannel.Config{}, logger)
		c.pub, c.sub = gc, gc
		return nil
	},
	"sql": func(c *connection, logger watermill.LoggerAdapter) error {
		// The messages and the records in the service's own PostgreSQL.
		db, err := sqlx.Open("pgx", envOr("POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
		if err != nil {
			return err
		}
		c.closers = append(c.closers, db.Close)
		if c.store, err = sqlstore.New(sqlstore.Config{Dialect: sqlstore.Postgres(), DB: db}); err != nil { // outbox
			return err
		}
		if c.pub, err = wsql.NewPublisher(db, wsql.PublisherConfig{
			SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true,
		}, logger); err != nil {
			return err
		}
		c.sub, err = wsql.NewSubscriber(db, wsql.SubscriberConfig{
			ConsumerGroup:  group,
			SchemaAdapter:  wsql.DefaultPostgreSQLSchema{},
			OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true,
		}, logger)
		return err
	},
	"amqp": func(c *connection, logger watermill.LoggerAdapter) error {
		// An exchange per topic and a queue per topic and group.
		config := amqp.NewDurablePubSubConfig(envOr("AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/"), amqp.GenerateQueueNameTopicNameWithSuffix(group))
		var err error
		if c.pub, err = amqp.NewPublisher(config, logger); err != nil {
			return err
		}
		c.sub, err = amqp.NewSubscriber(config, logger)
		return err
	},
	"kafka": func(c *connection, logger watermill.LoggerAdapter) error {
		brokers := []string{os.Getenv("KAFKA_BROKERS")}
		if brokers[0] == "" {
			// No broker given: an in-process one that speaks the protocol.
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
			if err != nil {
				return err
			}
			c.closers = append(c.closers, func() error { cluster.Close(); return nil })
			brokers = cluster.ListenAddrs()
		}
		var err error
		if c.pub, err = kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}}, logger); err != nil {
			return err
		}
		saramaConfig := kafka.DefaultSaramaSubscriberConfig()
		// A group that is new at startup must start at the oldest offset,
		// or it skips what replay sent before it joined.
		saramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
		c.sub, err = kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{},
			OverwriteSaramaConfig: saramaConfig, ConsumerGroup: group,
		}, logger)
		return err
	},
	"nats": func(c *connection, logger watermill.LoggerAdapter) error {
		url := envOr("NATS_URL", "nats://127.0.0.1:4222")
		// A stream per topic, created on first use, and a durable consumer
		// per topic and group that starts at the stream's first message.
		js := wnats.JetStreamConfig{
			AutoProvision:     true,
			SubscribeOptions:  []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit()},
			DurablePrefix:     group,
			DurableCalculator: func(prefix, topic string) string { return prefix + "_" + topic },
		}
		var err error
		if c.pub, err = wnats.NewPublisher(wnats.PublisherConfig{URL: url, Marshaler: &wnats.NATSMarshaler{}, JetStream: js}, logger); err != nil {
			return err
		}
		c.sub, err = wnats.NewSubscriber(wnats.SubscriberConfig{
			URL: url, QueueGroupPrefix: group, Unmarshaler: &wnats.NATSMarshaler{}, JetStream: js,
		}, logger)
		return err
	},
	"redis": func(c *connection, logger watermill.LoggerAdapter) error {
		addr := envOr("REDIS_ADDR", "127.0.0.1:6379")
		var err error
		if c.pub, err = redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(&redis.Options{Addr: addr})}, logger); err != nil {
			return err
		}
		c.sub, err = redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client: redis.NewClient(&redis.Options{Addr: addr}), ConsumerGroup: group,
		}, logger)
		return err
	},
}

func brokerNames() []string {
	names := make([]string, 0, len(brokers))
	for name := range brokers {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// connect builds the broker's pub/sub and the record store: in a SQLite file
// of the service unless the broker put it elsewhere.
func connect(ctx context.Context, broker string, logger watermill.LoggerAdapter) (c *connection, err error) {
	build, ok := brokers[broker]
	if !ok {
		return nil, fmt.Errorf("unknown broker %q, want one of %v", broker, brokerNames())
	}
	c = &connection{}
	defer func() {
		if err != nil {
			err, c = errors.Join(err, c.close()), nil
		}
	}()
	if err := build(c, logger); err != nil {
		return nil, fmt.Errorf("%s: %w", broker, err)
	}
	c.closers = append(c.closers, c.pub.Close, c.sub.Close)
	if c.store == nil {
		db, err := shop.SQLite("anybroker-" + broker)
		if err != nil {
			return nil, err
		}
		c.closers = append([]func() error{db.Close}, c.closers...)
		if c.store, err = sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db}); err != nil { // outbox
			return nil, err
		}
	}
	if err := c.store.Migrate(ctx); err != nil { // outbox
		return nil, err
	}
	return c, nil
}
