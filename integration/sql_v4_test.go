package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	wsql4 "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/integration/scenarios"
	"github.com/wmoutbox/outbox/internal/testenv"
)

// sqlV4PubSub is watermill-sql v4 on one database, as sqlPubSub is v3. The
// design pins v3; v4 is the current major and runs the same suite beside it.
//
// v4 takes its own Beginner and ContextExecutor interfaces instead of
// database/sql's, so the *sqlx.DB is wrapped with BeginnerFromStdSQL (a pgx
// pool would take BeginnerFromPgx). The default adapters create the same
// tables as v3's, under the same names ("watermill_<topic>",
// "watermill_offsets_<topic>"); the suite's topics are random, so the v3 and
// v4 runs never meet in one table.
type sqlV4PubSub struct {
	name        string
	open        func(tb testing.TB) *sqlx.DB
	schema      wsql4.SchemaAdapter
	offsets     wsql4.OffsetsAdapter
	tables      func(topic string) []string // quoted
	ackDeadline *time.Duration              // nil for the default (30s)
}

func TestSQLv4(t *testing.T) {
	t.Parallel()
	for _, ps := range []sqlV4PubSub{
		{
			name: "PostgreSQL", open: testenv.Postgres,
			schema: wsql4.DefaultPostgreSQLSchema{}, offsets: wsql4.DefaultPostgreSQLOffsetsAdapter{},
			tables: func(topic string) []string {
				return []string{`"watermill_` + topic + `"`, `"watermill_offsets_` + topic + `"`}
			},
		},
		{
			name: "MariaDB", open: testenv.MySQL,
			schema: wsql4.DefaultMySQLSchema{}, offsets: wsql4.DefaultMySQLOffsetsAdapter{},
			// The same serializable batch lock as v3's MySQL subscriber
			// (see TestSQL): a short deadline keeps restarts quick.
			ackDeadline: durationPtr(2 * time.Second),
			tables: func(topic string) []string {
				return []string{"`watermill_" + topic + "`", "`watermill_offsets_" + topic + "`"}
			},
		},
	} {
		t.Run(ps.name, func(t *testing.T) {
			t.Parallel()
			ps.open(t) // skips, naming the database, when it is not reachable
			recs := records(t, "SQLite")
			if ps.name == "PostgreSQL" {
				recs = records(t, "Postgres")
			}
			scenarios.Run(t, scenarios.Backend{
				Name:    "SQL v4 on " + ps.name,
				Records: recs,
				Connect: ps.connect,
				Remove:  ps.remove,
			})
		})
	}
}

func (ps sqlV4PubSub) connect(t *testing.T, group string) (message.Publisher, message.Subscriber) {
	db := wsql4.BeginnerFromStdSQL(ps.open(t))
	pub, err := wsql4.NewPublisher(db, wsql4.PublisherConfig{SchemaAdapter: ps.schema, AutoInitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		t.Fatalf("sql v4 publisher: %v", err)
	}
	sub, err := wsql4.NewSubscriber(db, wsql4.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    ps.schema,
		OffsetsAdapter:   ps.offsets,
		InitializeSchema: true,
		PollInterval:     50 * time.Millisecond,
		ResendInterval:   50 * time.Millisecond,
		AckDeadline:      ps.ackDeadline,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatalf("sql v4 subscriber: %v", err)
	}
	return connected(t, pub, sub)
}

func (ps sqlV4PubSub) remove(t *testing.T, topic, _ string) {
	db := ps.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, table := range ps.tables(topic) {
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
			t.Logf("drop %s: %v", table, err)
		}
	}
}
