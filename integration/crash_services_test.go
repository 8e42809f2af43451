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

var crashServicesKills = flag.Int("crash.services.kills", 24, "kills of the two-service setup (soak: -crash.services.kills=100)")

// envServiceBDSN is the DSN of service B's SQLite file.
const envServiceBDSN = "OUTBOX_CRASH_B_DSN"

// TestCrashChildServiceA is service A of TestCrashTwoServices (PostgreSQL);
// it does nothing unless started by that test.
func TestCrashChildServiceA(t *testing.T) {
	if !crashtest.IsChild(t.Name()) {
		t.Skip("runs only as a child of TestCrashTwoServices")
	}
	crashtest.ServiceA(crashChildConfig(testenv.Postgres(t), sqlstore.Postgres()))
}

// TestCrashChildServiceB is service B of TestCrashTwoServices (a SQLite
// file of its own); it does nothing unless started by that test.
func TestCrashChildServiceB(t *testing.T) {
	if !crashtest.IsChild(t.Name()) {
		t.Skip("runs only as a child of TestCrashTwoServices")
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
	admin, err := amqp091.Dial(amqpURI())
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	defer admin.Close()
	dbA := testenv.Postgres(t)
	table := testenv.Table(t)
	dsnB := testenv.SQLiteDSN(t)
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

	sum := crashtest.RunServices(t, crashtest.ServicesConfig{
		ChildA: "TestCrashChildServiceA",
		ChildB: "TestCrashChildServiceB",
		Kills:  *crashServicesKills,
		Batch:  5,
		Seed:   crashRunSeed(t),
		DBA:    dbA,
		Table:  table,
		DBB:    dbB,
		Env: []string{"OUTBOX_TEST_POSTGRES_DSN=" + testenv.PostgresDSN(), "OUTBOX_TEST_AMQP_URI=" + amqpURI(),
			envServiceBDSN + "=" + dsnB},
	})
	t.Logf("two services, PostgreSQL+SQLite over RabbitMQ: %s", sum)
	crashtest.CheckServices(t, sum)
}
