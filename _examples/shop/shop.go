// Package shop is the service that the examples adopt the outbox in, as it
// was before: a router with a ship_orders handler and code that publishes
// three orders. The examples keep only what differs: the pub/sub's
// constructor and the lines marked // outbox.
package shop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // the SQLite driver

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxops"
)

// Topic is the topic the service publishes its orders to.
const Topic = "orders"

// SQLite opens the service's database: a SQLite file in the temp directory
// named after the example, removed first (with its WAL files) so that every
// run starts clean.
func SQLite(example string) (*sqlx.DB, error) {
	file := filepath.Join(os.TempDir(), "outbox-example-"+example+".db")
	for _, f := range []string{file, file + "-wal", file + "-shm"} {
		if err := os.RemoveAll(f); err != nil {
			return nil, err
		}
	}
	db, err := sqlx.Open("sqlite", "file:"+file+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // SQLite has one writer
	return db, nil
}

// Run is the rest of the service: it adds the ship_orders handler on sub to
// router, runs the router, publishes three orders through pub, waits until
// they are shipped and closes the router. It then prints the line that CI
// checks, "<example>: 3 orders shipped; 0 records pending", from the
// outbox's own status, and fails if a record of reg is left pending.
//
// Most brokers keep messages between runs, and a copy whose acknowledgement
// the previous run's shutdown cut off comes again (NATS reads the whole
// stream again, as the subscriber deletes the durable consumer it created):
// each order carries the id of its run, and the handler skips the others.
func Run(ctx context.Context, example string, router *message.Router, sub message.Subscriber, pub message.Publisher, reg *outbox.Registry) error {
	run := watermill.NewShortUUID()
	shipped := make(chan struct{}, 10)
	router.AddNoPublisherHandler("ship_orders", Topic, sub, func(msg *message.Message) error {
		if msg.Metadata.Get("run") != run {
			return nil
		}
		var order struct{ ID string }
		if err := json.Unmarshal(msg.Payload, &order); err != nil {
			return err
		}
		fmt.Println("shipped", order.ID)
		shipped <- struct{}{}
		return nil
	})
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return err
	}

	// The service's publishing code. The payloads are JSON, which
	// watermill-sql's payload column wants.
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"id":%q}`, order)))
		msg.Metadata.Set("run", run)
		if err := pub.Publish(Topic, msg); err != nil {
			return errors.Join(err, router.Close(), <-runErr)
		}
	}
	for i := range 3 {
		select {
		case <-shipped:
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("%d of 3 orders shipped: %w", i, ctx.Err()), router.Close(), <-runErr)
		}
	}
	// Close waits for the running handlers, so their records are completed.
	if err := errors.Join(router.Close(), <-runErr); err != nil {
		return err
	}

	status, err := outboxops.ReadStatus(ctx, reg, outboxops.StatusOptions{})
	if err != nil {
		return err
	}
	var pending int64
	for _, st := range status {
		pending += st.Pending
	}
	fmt.Printf("%s: 3 orders shipped; %d records pending\n", example, pending)
	if pending != 0 {
		return errors.New("records left pending")
	}
	return nil
}
