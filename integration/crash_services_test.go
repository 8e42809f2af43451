package integration_test

import (
	"flag"
	"os"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/wmoutbox/outbox/internal/crashtest"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

var (
	crashServicesKills        = flag.Int("crash.services.kills", 24, "kills of the two-service setup (soak: -crash.services.kills=100)")
	crashServicesOrderedKills = flag.Int("crash.services.ordered.kills", 10, "kills of the ordered two-service setup (soak: -crash.services.ordered.kills=150)")
)

// crashServicesKeys is the number of order keys of the ordered two-service
// setup.
const crashServicesKeys = 32

// envServiceBDSN is the DSN of service B's SQLite file.
const envServiceBDSN = "OUTBOX_CRASH_B_DSN"

// TestCrashChildServiceA is service A of TestCrashTwoServices (PostgreSQL);
// it does nothing unless started by that test.
func TestCrashChildServiceA(t *testing.T) {
	if !crashtest.IsChild(t.Name()) {
		t.Skip("runs only as a child of TestCrashTwoServices*")
	}
	crashtest.ServiceA(crashChildConfig(testenv.Postgres(t), sqlstore.Postgres()))
}

// TestCrashChildServiceB is service B of TestCrashTwoServices (a SQLite
// file of its own); it does nothing unless started by that test.
func TestCrashChildServiceB(t *testing.T) {
	if !crashtest.IsChild(t.Name()) {
		t.Skip("runs only as a child of TestCrashTwoServices*")
	}
	db := testenv.Open(t, "SQLite", "sqlite", os.Getenv(envServiceBDSN))
	db.SetMaxOpenConns(1)
	crashtest.ServiceB(crashChildConfig(db, sqlstore.SQLite()))
}

// TestCrashTwoServices runs service A (PostgreSQL) and service B (SQLite), a
// process and a database each, which meet only on RabbitMQ: A publishes a
// tracked topic whose remote consumer is B's handler, B writes its effect
// and its inbox entry in one transaction and confirms to A. Each of them is
// SIGKILLed at random moments and at its halt points (A between insert and
// send and between a confirmation and its completion, B inside its
// transaction and between its commit and its confirmation) and restarted.
// After a drain, A has no pending record and B has exactly one effect per
// record of A.
func TestCrashTwoServices(t *testing.T) {
	sum := crashTwoServices(t, *crashServicesKills, 0, 1)
	t.Logf("two services, PostgreSQL+SQLite over RabbitMQ: %s", sum)
	crashtest.CheckServices(t, sum)
}

// TestCrashTwoServicesOrdered is TestCrashTwoServices on a topic ordered by
// key (crashServicesKeys keys), with two instances of B on B's queue and
// database, so that two messages of a key can run at once in two
// processes: A publishes until it is killed, each B is killed every 1 to 3
// seconds and A every 3 to 8, and besides exactly one effect per record,
// B's database must hold each key's effects in the order A saved them,
// each written with its position within its key in the transaction of its
// inbox entry.
func TestCrashTwoServicesOrdered(t *testing.T) {
	sum := crashTwoServices(t, *crashServicesOrderedKills, crashServicesKeys, 2)
	t.Logf("two services ordered by key, PostgreSQL+SQLite over RabbitMQ: %s", sum)
	crashtest.CheckServicesOrdered(t, sum)
}

// crashTwoServices runs the two-service setup, ordered by keys keys when
// not zero, with instancesB processes of B.
func crashTwoServices(t *testing.T, kills, keys, instancesB int) crashtest.ServicesSummary {
	admin, err := amqp091.Dial(amqpURI())
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	defer admin.Close()
	dbA := testenv.Postgres(t)
	table := testenv.Table(t)
	// Writers of B's instances take the file's lock when their transaction
	// begins, waiting for it up to the busy timeout, rather than fail when
	// their first write finds another's commit.
	dsnB := testenv.SQLiteDSN(t) + "&_txlock=immediate"
	dbB := testenv.Open(t, "SQLite", "sqlite", dsnB)
	dbB.SetMaxOpenConns(1)
	crashtest.PrepareServices(t, dbA, sqlstore.Postgres(), table, dbB, sqlstore.SQLite())
	topic, confirmTopic := crashtest.Topics(table)
	t.Cleanup(func() {
		ch, err := admin.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		_, _ = ch.QueueDelete(crashAMQPConfig(crashtest.ConsumerB).Queue.GenerateName(topic), false, false, false)
		_, _ = ch.QueueDelete(crashAMQPConfig(crashtest.ConfirmGroup).Queue.GenerateName(confirmTopic), false, false, false)
		for _, exchange := range []string{topic, confirmTopic} {
			_ = ch.ExchangeDelete(crashAMQPConfig(crashtest.ConsumerB).Exchange.GenerateName(exchange), false, false)
		}
	})

	return crashtest.RunServices(t, crashtest.ServicesConfig{
		ChildA:     "TestCrashChildServiceA",
		ChildB:     "TestCrashChildServiceB",
		Kills:      kills,
		Keys:       keys,
		InstancesB: instancesB,
		Batch:      5,
		Seed:       crashRunSeed(t),
		DBA:        dbA,
		Table:      table,
		DBB:        dbB,
		Env: []string{"OUTBOX_TEST_POSTGRES_DSN=" + testenv.PostgresDSN(), "OUTBOX_TEST_AMQP_URI=" + amqpURI(),
			envServiceBDSN + "=" + dsnB},
	})
}
