package main

import (
	"context"
	"testing"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"

	"github.com/wmoutbox/outbox/internal/testenv"
)

// The go test counterparts of the program's publish cases, to read beside
// BenchmarkTrackedPublish of the outbox package: the same message published
// with Watermill's classic outbox, and the raw INSERT.

func benchDatabase(tb testing.TB, name string) *database {
	tb.Helper()
	switch name {
	case "postgres":
		testenv.Postgres(tb) // skips, or fails under CI=true, when PostgreSQL is not reachable
	case "mariadb":
		testenv.MySQL(tb) // likewise for MariaDB
	}
	d, err := openDatabase(context.Background(), name, dsns{postgres: testenv.PostgresDSN(), mysql: testenv.MySQLDSN()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(d.close)
	return d
}

// BenchmarkClassicPublish is one message per transaction through
// watermill-sql's publisher wrapped by the forwarder's envelope.
func BenchmarkClassicPublish(b *testing.B) {
	d := benchDatabase(b, "postgres")
	ctx := context.Background()
	topic := "bench_fwd_go_test"
	// Creates the forwarder's table, as its subscriber would.
	init, err := wsql.NewPublisher(d.db.DB, wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := forwarder.NewPublisher(init, forwarder.PublisherConfig{ForwarderTopic: topic}).Publish("orders", benchMessage()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = d.db.ExecContext(ctx, `DROP TABLE IF EXISTS "watermill_`+topic+`"`) })
	pub := &txPublisher{db: d.db.DB, schema: wsql.DefaultPostgreSQLSchema{}, forwarderTopic: topic}
	b.ReportAllocs()
	for b.Loop() {
		if err := pub.Publish("orders", benchMessage()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawInsert is the single-row INSERT … RETURNING id the tracked
// publish is compared with.
func BenchmarkRawInsert(b *testing.B) {
	for _, name := range []string{"postgres", "sqlite"} {
		b.Run(name, func(b *testing.B) {
			d := benchDatabase(b, name)
			ctx := context.Background()
			r, err := newRawSQL(ctx, d)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { r.close(ctx) })
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.insertOne(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
