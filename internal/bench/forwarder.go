package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
)

// defaultPoll is watermill-sql's default poll interval: how long its
// subscriber waits after a query that found nothing.
const defaultPoll = time.Second

// watermillSQL is the pair of watermill-sql adapters for a database.
type watermillSQL struct {
	schema  wsql.SchemaAdapter
	offsets wsql.OffsetsAdapter
	// offsetColumn is the messages table's offset column, quoted.
	offsetColumn string
	tables       func(topic string) []string // the tables they create, quoted
}

// caughtUp says whether the forwarder acknowledged the last row of its
// table. Rows committed after a higher offset was acknowledged are never
// read: watermill-sql's MySQL offsets have that gap
// (ThreeDotsLabs/watermill#311; PostgreSQL orders by transaction id).
func (a watermillSQL) caughtUp(db *sql.DB, topic string) bool {
	t := a.tables(topic)
	var last, acked sql.NullInt64
	q := "SELECT (SELECT MAX(" + a.offsetColumn + ") FROM " + t[0] + "), (SELECT MAX(offset_acked) FROM " + t[1] + ")"
	if err := db.QueryRow(q).Scan(&last, &acked); err != nil {
		return false
	}
	return acked.Int64 >= last.Int64
}

// hasForwarder says whether watermill-sql, and so Watermill's forwarder,
// runs on the database.
func (d *database) hasForwarder() bool { return d.name != "sqlite" }

// noForwarder is why the forwarder's cases do not run on SQLite.
const noForwarder = "watermill-sql v3 has no SQLite adapter"

func (d *database) watermillSQL() (watermillSQL, error) {
	switch d.name {
	case "postgres":
		s, o := wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}
		return watermillSQL{s, o, `"offset"`, func(t string) []string { return []string{s.MessagesTable(t), o.MessagesOffsetsTable(t)} }}, nil
	case "mariadb":
		s, o := wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}
		return watermillSQL{s, o, "`offset`", func(t string) []string { return []string{s.MessagesTable(t), o.MessagesOffsetsTable(t)} }}, nil
	}
	return watermillSQL{}, fmt.Errorf("%s: %s", d.name, noForwarder)
}

// classicPipeline is Watermill's own transactional outbox, with default
// settings but the poll interval: each Publish opens a transaction,
// inserts the message through a watermill-sql publisher on it (wrapped by
// the forwarder's envelope publisher) and commits; components/forwarder
// reads the table with a watermill-sql subscriber, in batches of 100, and
// publishes to GoChannel, where the handlers are.
func classicPipeline(ctx context.Context, d *database, poll time.Duration) (pipeline, error) {
	adapters, err := d.watermillSQL()
	if err != nil {
		return pipeline{}, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	topic := "bench_fwd_" + hex.EncodeToString(b[:])
	sub, err := wsql.NewSubscriber(d.db.DB, wsql.SubscriberConfig{
		SchemaAdapter:    adapters.schema,
		OffsetsAdapter:   adapters.offsets,
		InitializeSchema: true,
		PollInterval:     poll,
	}, nil)
	if err != nil {
		return pipeline{}, err
	}
	gc := newGoChannel()
	fwd, err := forwarder.NewForwarder(sub, gc, nil, forwarder.Config{ForwarderTopic: topic})
	if err != nil {
		return pipeline{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(runCtx) }()
	select {
	case <-fwd.Running():
	case err := <-runErr:
		cancel()
		return pipeline{}, fmt.Errorf("forwarder: %w", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = fwd.Close()
			cancel()
			<-runErr // the forwarder's router closes sub
		})
	}
	return pipeline{
		pub:      &txPublisher{db: d.db.DB, schema: adapters.schema, forwarderTopic: topic},
		sub:      gc,
		caughtUp: func() bool { return adapters.caughtUp(d.db.DB, topic) },
		stop:     stop,
		close: func() {
			stop()
			_ = gc.Close()
			// The tables watermill-sql created; topic is a generated name.
			for _, t := range adapters.tables(topic) {
				_, _ = d.db.Exec("DROP TABLE IF EXISTS " + t)
			}
		},
	}, nil
}

// txPublisher publishes each call in a transaction of its own, as a service
// saving a business change and its event together would.
type txPublisher struct {
	db             *sql.DB
	schema         wsql.SchemaAdapter
	forwarderTopic string
}

func (p *txPublisher) Publish(topic string, msgs ...*message.Message) error {
	tx, err := p.db.BeginTx(context.Background(), nil)
	if err != nil {
		return err
	}
	sqlPub, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: p.schema}, nil)
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: p.forwarderTopic})
	if err := pub.Publish(topic, msgs...); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (p *txPublisher) Close() error { return nil }
