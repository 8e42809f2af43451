package crashtest_test

import (
	"flag"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/crashtest"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

var (
	kills          = flag.Int("crash.kills", 24, "kill cycles per setup (soak: -crash.kills=300)")
	consumersKills = flag.Int("crash.consumers.kills", -1, "kill cycles of the two-consumer setups (-1: as -crash.kills)")
	seed           = flag.Uint64("crash.seed", 0, "seed of the kill points (0: from the clock)")
	orderedKills   = flag.Int("crash.ordered.kills", 12, "kill cycles of the ordered setups (soak: -crash.ordered.kills=300)")
)

// twoConsumers are the declared consumers of the two-consumer setups.
var twoConsumers = []string{"email", "stats"}

func twoConsumerKills() int {
	if *consumersKills < 0 {
		return *kills
	}
	return *consumersKills
}

func TestMain(m *testing.M) {
	os.Setenv(outbox.EnvToggle, "on")
	os.Exit(m.Run())
}

func runSeed(t *testing.T) uint64 {
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -crash.seed=%d)", s, s)
	return s
}

// TestCrashChildSQLite is the service the crash test kills; it does nothing
// unless started by the crash test.
func TestCrashChildSQLite(t *testing.T) {
	if !crashtest.IsChild(t.Name()) {
		t.Skip("runs only as the child of TestCrashSQLiteGoChannel*")
	}
	db, err := sqlx.Open("sqlite", os.Getenv("OUTBOX_CRASH_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	// Non-persistent: a kill wipes every in-flight message, so only the
	// records and replay can save them. Every subscription gets each
	// message, so the consumers share it.
	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	crashtest.Child(crashtest.ChildConfig{
		DB:      db,
		Dialect: sqlstore.SQLite(),
		Publisher: func() (message.Publisher, func(), error) {
			return gc, func() { _ = gc.Close() }, nil
		},
		Subscriber: func(string) (message.Subscriber, error) { return gc, nil },
	})
}

// TestCrashSQLiteGoChannel kills a SQLite + GoChannel service with SIGKILL
// between insert and send, mid-handler, between handler and mark and at
// random moments, and checks that every committed record was handled.
func TestCrashSQLiteGoChannel(t *testing.T) {
	crashSQLiteGoChannel(t, *kills, nil)
}

// TestCrashSQLiteGoChannelTwoConsumers is TestCrashSQLiteGoChannel with two
// declared consumers of the tracked topic, two handlers in one router on
// one GoChannel: each must handle every committed record.
func TestCrashSQLiteGoChannelTwoConsumers(t *testing.T) {
	crashSQLiteGoChannel(t, twoConsumerKills(), twoConsumers)
}

// TestCrashSQLiteGoChannelOrdered is TestCrashSQLiteGoChannelTwoConsumers
// on a topic ordered by key: besides losing nothing, each consumer handles
// the records of a key in the order they were saved, across the kills.
func TestCrashSQLiteGoChannelOrdered(t *testing.T) {
	crashSQLiteGoChannelWith(t, *orderedKills, twoConsumers, true)
}

// TestCrashSQLiteGoChannelChecked is TestCrashSQLiteGoChannel with every
// copy checked and each delivery completed before its acknowledgement
// (MiddlewareConfig.Check.FirstCopies, Complete.BeforeAck), the opt-outs of
// the defaults.
func TestCrashSQLiteGoChannelChecked(t *testing.T) {
	crashSQLiteGoChannelIn(t, *kills, nil, false, true)
}

func crashSQLiteGoChannel(t *testing.T, kills int, consumers []string) {
	crashSQLiteGoChannelWith(t, kills, consumers, false)
}

func crashSQLiteGoChannelWith(t *testing.T, kills int, consumers []string, ordered bool) {
	crashSQLiteGoChannelIn(t, kills, consumers, ordered, false)
}

func crashSQLiteGoChannelIn(t *testing.T, kills int, consumers []string, ordered, checked bool) {
	dsn := testenv.SQLiteDSN(t)
	db := testenv.Open(t, "SQLite", "sqlite", dsn)
	table := testenv.Table(t)
	crashtest.Prepare(t, db, sqlstore.SQLite(), table)

	sum := crashtest.Run(t, crashtest.Config{
		ChildTest: "TestCrashChildSQLite",
		Kills:     kills,
		Batch:     5,
		Seed:      runSeed(t),
		DB:        db,
		Table:     table,
		Consumers: consumers,
		Env:       []string{"OUTBOX_CRASH_DSN=" + dsn},
		Ordered:   ordered,
		Checked:   checked,
	})
	t.Logf("SQLite+GoChannel: %s", sum)
	crashtest.Check(t, sum)
}
