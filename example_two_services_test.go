package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// README:begin two-services

// adoptSender adds the outbox to the sender of "orders".
func adoptSender(ctx context.Context, db *sql.DB, router *message.Router, publisher message.Publisher, confirmations message.Subscriber, logger watermill.LoggerAdapter) (*outbox.TxPublisher, error) {
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: sqlx.NewDb(db, "sqlite")})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{
		Topic: "orders", Store: store,
		RemoteConsumers: []string{"billing"}, // the receivers' handler names
	})
	if err != nil {
		return nil, err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, logger)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(mw)
	router.AddPlugin(outbox.ReplayPlugin(reg, publisher, outbox.ReplayConfig{}, logger))
	if err := outbox.AddConfirmationHandler(router, reg, confirmations, logger); err != nil {
		return nil, err
	}
	return outbox.NewTxPublisher(reg, publisher)
}

// placeOrder commits the order with its record, then sends.
func placeOrder(ctx context.Context, db *sql.DB, orders *outbox.TxPublisher, id string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	ptx := orders.Wrap(tx)
	defer ptx.Rollback()
	if _, err := ptx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", id); err != nil {
		return err
	}
	if err := ptx.Publish(ctx, "orders", message.NewMessage(watermill.NewUUID(), []byte(id))); err != nil {
		return err
	}
	return ptx.Commit()
}

// adoptReceiver adds the outbox, its inbox and the "billing" handler to
// the receiver.
func adoptReceiver(ctx context.Context, db *sql.DB, router *message.Router, publisher message.Publisher, subscriber message.Subscriber, logger watermill.LoggerAdapter) error {
	inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: sqlstore.SQLite(), DB: sqlx.NewDb(db, "sqlite")})
	if err != nil {
		return err
	}
	if err := inbox.Migrate(ctx); err != nil {
		return err
	}
	reg, err := outbox.NewRegistry()
	if err != nil {
		return err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Inbox: inbox, Confirmations: publisher}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(mw)
	router.AddNoPublisherHandler("billing", "orders", subscriber, charge(db)) // the sender's RemoteConsumers entry
	return nil
}

// charge commits the charge with the message's inbox entry.
func charge(db *sql.DB) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		switch err := outbox.InboxTx(ctx, tx, msg); {
		case errors.Is(err, outbox.ErrAlreadyHandled):
			return nil // a concurrent copy did it
		case err != nil:
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO charges (order_id) VALUES (?)", string(msg.Payload)); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// README:end two-services

// Two services, each with a SQLite file of its own, on one GoChannel: the
// order commits with its record, the charge with its inbox entry; a copy
// sent again charges nothing, and the sender's table drains once the
// receiver has confirmed.
func Example_twoServices() {
	dir, err := os.MkdirTemp("", "outbox-two-services")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	open := func(name, table string) *sql.DB {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, name)+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
		if err != nil {
			panic(err)
		}
		db.SetMaxOpenConns(1)
		if _, err := db.Exec(table); err != nil {
			panic(err)
		}
		return db
	}
	count := func(db *sql.DB, query string) (n int) {
		if err := db.QueryRow(query).Scan(&n); err != nil {
			panic(err)
		}
		return n
	}
	ctx := context.Background()
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)

	// The receiving service, billing.
	billingDB := open("billing.db", "CREATE TABLE charges (order_id TEXT)")
	defer billingDB.Close()
	billing, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	// Hands the example each copy that reached the receiver, run or not.
	copies := make(chan *message.Message, 8)
	billing.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			c := msg.Copy()
			out, err := h(msg)
			copies <- c
			return out, err
		}
	})
	if err := adoptReceiver(ctx, billingDB, billing, pubSub, pubSub, logger); err != nil {
		panic(err)
	}

	// The sending service, orders.
	ordersDB := open("orders.db", "CREATE TABLE orders (id TEXT PRIMARY KEY)")
	defer ordersDB.Close()
	sender, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	// Tells the example each confirmation the sender has handled.
	confirmed := make(chan struct{}, 8)
	sender.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if message.SubscribeTopicFromCtx(msg.Context()) == outbox.DefaultConfirmTopic {
				confirmed <- struct{}{}
			}
			return out, err
		}
	})
	orders, err := adoptSender(ctx, ordersDB, sender, pubSub, pubSub, logger)
	if err != nil {
		panic(err)
	}
	for _, r := range []*message.Router{billing, sender} {
		go func() {
			if err := r.Run(ctx); err != nil {
				panic(err)
			}
		}()
		<-r.Running()
	}

	if err := placeOrder(ctx, ordersDB, orders, "order-1"); err != nil {
		panic(err)
	}
	first := <-copies
	<-confirmed
	delivered := 1
	// The same message again, as a broker's redelivery or a resend: the
	// inbox skips it and confirms it again.
	if err := pubSub.Publish("orders", first); err != nil {
		panic(err)
	}
	<-copies
	<-confirmed
	delivered++
	for _, r := range []*message.Router{billing, sender} {
		if err := r.Close(); err != nil {
			panic(err)
		}
	}

	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: sqlx.NewDb(ordersDB, "sqlite")})
	if err != nil {
		panic(err)
	}
	pending, err := store.PendingAfter(ctx, "orders", 0, 100)
	if err != nil {
		panic(err)
	}
	fmt.Printf("orders placed: %d; order-1 charged %d time(s) from %d copies; %d record(s) pending at the sender\n",
		count(ordersDB, "SELECT COUNT(*) FROM orders"),
		count(billingDB, "SELECT COUNT(*) FROM charges WHERE order_id = 'order-1'"), delivered, len(pending))
	// Output:
	// orders placed: 1; order-1 charged 1 time(s) from 2 copies; 0 record(s) pending at the sender
}
