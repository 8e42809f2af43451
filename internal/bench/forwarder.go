package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
)

// classicPipeline is Watermill's own transactional outbox, with default
// settings: each Publish opens a transaction, inserts the message through a
// watermill-sql publisher on it (wrapped by the forwarder's envelope
// publisher) and commits; components/forwarder reads the table with a
// watermill-sql subscriber and publishes to GoChannel, where the handlers
// are.
func classicPipeline(ctx context.Context, d *database) (pipeline, error) {
	if d.name != "postgres" {
		return pipeline{}, errors.New("watermill-sql v3 has no SQLite adapter")
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	topic := "bench_fwd_" + hex.EncodeToString(b[:])
	sub, err := wsql.NewSubscriber(d.db.DB, wsql.SubscriberConfig{
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
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
	return pipeline{
		pub: &txPublisher{db: d.db.DB, forwarderTopic: topic},
		sub: gc,
		close: func() {
			_ = fwd.Close()
			cancel()
			<-runErr // the forwarder's router closes sub
			_ = gc.Close()
			// The tables watermill-sql created; topic is a generated name.
			_, _ = d.db.Exec(`DROP TABLE IF EXISTS "watermill_` + topic + `", "watermill_offsets_` + topic + `"`)
		},
	}, nil
}

// txPublisher publishes each call in a transaction of its own, as a service
// saving a business change and its event together would.
type txPublisher struct {
	db             *sql.DB
	forwarderTopic string
}

func (p *txPublisher) Publish(topic string, msgs ...*message.Message) error {
	tx, err := p.db.BeginTx(context.Background(), nil)
	if err != nil {
		return err
	}
	sqlPub, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, nil)
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
