package integration_test

import (
	"flag"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/wmoutbox/outbox/internal/crashtest"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

var (
	crashKills          = flag.Int("crash.kills", 24, "kill cycles (soak: -crash.kills=300)")
	crashConsumersKills = flag.Int("crash.consumers.kills", -1, "kill cycles of the two-consumer setup (-1: as -crash.kills)")
	crashSeed           = flag.Uint64("crash.seed", 0, "seed of the kill points (0: from the clock)")
	crashOrderedKills   = flag.Int("crash.ordered.kills", 12, "kill cycles of the ordered setup (soak: -crash.ordered.kills=300)")
)

func amqpURI() string { return env("OUTBOX_TEST_AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/") }

// crashAMQPConfig is the durable pub/sub topology with a queue per topic and
// consumer, so that each consumer gets every message.
func crashAMQPConfig(consumer string) amqp.Config {
	return amqp.NewDurablePubSubConfig(amqpURI(), amqp.GenerateQueueNameTopicNameWithSuffix(consumer))
}

// TestCrashChildAMQP is the service TestCrashPostgresRabbitMQ kills; it does
// nothing unless started by that test.
func TestCrashChildAMQP(t *testing.T) {
	if !crashtest.IsChild(t.Name()) {
		t.Skip("runs only as the child of TestCrashPostgresRabbitMQ")
	}
	crashtest.Child(crashChildConfig(testenv.Postgres(t), sqlstore.Postgres()))
}

// crashChildConfig is a crash child on db with RabbitMQ as its broker.
func crashChildConfig(db *sqlx.DB, dialect *sqlstore.Dialect) crashtest.ChildConfig {
	return crashtest.ChildConfig{
		DB:      db,
		Dialect: dialect,
		Publisher: func() (message.Publisher, func(), error) {
			// A publisher declares the exchange only: the queue of
			// the config is not used.
			pub, err := amqp.NewPublisher(crashAMQPConfig(crashtest.SingleHandler), watermill.NopLogger{})
			if err != nil {
				return nil, nil, err
			}
			return pub, func() { _ = pub.Close() }, nil
		},
		Subscriber: func(consumer string) (message.Subscriber, error) {
			return amqp.NewSubscriber(crashAMQPConfig(consumer), watermill.NopLogger{})
		},
	}
}

// TestCrashPostgresRabbitMQ kills a PostgreSQL + RabbitMQ service with
// SIGKILL between insert and send, mid-handler, between handler and mark and
// at random moments, and checks that every committed record was handled.
func TestCrashPostgresRabbitMQ(t *testing.T) {
	crashPostgresRabbitMQ(t, *crashKills, nil, false)
}

// TestCrashPostgresRabbitMQTwoConsumers is TestCrashPostgresRabbitMQ with
// two declared consumers of the tracked topic, each with a durable queue of
// its own: each must handle every committed record.
func TestCrashPostgresRabbitMQTwoConsumers(t *testing.T) {
	kills := *crashConsumersKills
	if kills < 0 {
		kills = *crashKills
	}
	crashPostgresRabbitMQ(t, kills, []string{"email", "stats"}, false)
}

// TestCrashPostgresRabbitMQOrdered is TestCrashPostgresRabbitMQTwoConsumers
// on a topic ordered by key: besides losing nothing, each consumer handles
// the records of a key in the order they were saved, across the kills.
func TestCrashPostgresRabbitMQOrdered(t *testing.T) {
	crashPostgresRabbitMQ(t, *crashOrderedKills, []string{"email", "stats"}, true)
}

// TestCrashPostgresRabbitMQChecked is TestCrashPostgresRabbitMQ with every
// copy checked and each delivery completed before its acknowledgement
// (MiddlewareConfig.Check.FirstCopies, Complete.BeforeAck), the opt-outs of
// the defaults.
func TestCrashPostgresRabbitMQChecked(t *testing.T) {
	crashPostgresRabbitMQ(t, *crashKills, nil, false, func(c *crashtest.Config) { c.Checked = true })
}

func crashPostgresRabbitMQ(t *testing.T, kills int, consumers []string, ordered bool, opts ...func(*crashtest.Config)) {
	admin, err := amqp091.Dial(amqpURI())
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	defer admin.Close()
	db := testenv.Postgres(t)
	table := testenv.Table(t)
	crashtest.Prepare(t, db, sqlstore.Postgres(), table)
	topic := "crash_" + table
	t.Cleanup(func() {
		ch, err := admin.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		for _, c := range append([]string{crashtest.SingleHandler}, consumers...) {
			_, _ = ch.QueueDelete(crashAMQPConfig(c).Queue.GenerateName(topic), false, false, false)
		}
		_ = ch.ExchangeDelete(crashAMQPConfig(crashtest.SingleHandler).Exchange.GenerateName(topic), false, false)
	})

	cfg := crashtest.Config{
		ChildTest: "TestCrashChildAMQP",
		Kills:     kills,
		Batch:     5,
		Seed:      crashRunSeed(t),
		DB:        db,
		Table:     table,
		Consumers: consumers,
		Env:       []string{"OUTBOX_TEST_POSTGRES_DSN=" + testenv.PostgresDSN(), "OUTBOX_TEST_AMQP_URI=" + amqpURI()},
		Ordered:   ordered,
	}
	for _, o := range opts {
		o(&cfg)
	}
	sum := crashtest.Run(t, cfg)
	t.Logf("PostgreSQL+RabbitMQ: %s", sum)
	crashtest.Check(t, sum)
}

// crashRunSeed returns the -crash.seed, or one from the clock, and logs it.
func crashRunSeed(t *testing.T) uint64 {
	t.Helper()
	seed := *crashSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -crash.seed=%d)", seed, seed)
	return seed
}
