package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// README:begin two-services

// adoptSender adds the outbox to the service that publishes "orders" to
// services with databases of their own: they confirm each delivery over the
// broker, and this service completes its records from their confirmations.
func adoptSender(ctx context.Context, db *sql.DB, router *message.Router, publisher message.Publisher, subscriber message.Subscriber, logger watermill.LoggerAdapter) (message.Publisher, error) {
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: sqlx.NewDb(db, "sqlite")})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{
		Topic: "orders", Store: store,
		RemoteConsumers: []string{"billing"}, // handler names in the other services
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
	// Completes each remote consumer's delivery from its confirmation.
	if err := outbox.AddConfirmationHandler(router, reg, subscriber, logger); err != nil {
		return nil, err
	}
	return outbox.NewPublisher(reg, publisher)
}

// adoptReceiver adds the outbox to a service that receives other services'
// tracked messages: its inbox skips copies it has handled, and it confirms
// each handled message to its sender.
func adoptReceiver(ctx context.Context, db *sql.DB, router *message.Router, publisher message.Publisher, logger watermill.LoggerAdapter) error {
	inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: sqlstore.SQLite(), DB: sqlx.NewDb(db, "sqlite")})
	if err != nil {
		return err
	}
	if err := inbox.Migrate(ctx); err != nil {
		return err
	}
	reg, err := outbox.NewRegistry() // add the service's own tracked topics here
	if err != nil {
		return err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Inbox: inbox, Confirmations: publisher}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(mw)
	return nil
}

// README:end two-services

// Two services, each with a SQLite file of its own, on one GoChannel: the
// sender's table drains once the receiver has confirmed, and a copy sent
// again is skipped by the receiver's inbox.
func Example_twoServices() {
	dir, err := os.MkdirTemp("", "outbox-two-services")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	open := func(name string) *sql.DB {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, name)+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
		if err != nil {
			panic(err)
		}
		db.SetMaxOpenConns(1)
		return db
	}
	ctx := context.Background()
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)

	// The receiving service: the billing handler charges each order once.
	billingDB := open("billing.db")
	defer billingDB.Close()
	billing, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex
	charged := map[string]int{}
	seen := make(chan string, 8)
	billing.AddNoPublisherHandler("billing", "orders", pubSub, func(msg *message.Message) error {
		mu.Lock()
		charged[string(msg.Payload)]++
		mu.Unlock()
		return nil
	})
	// Tells the example each copy that reached the receiver, run or not.
	billing.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			seen <- msg.UUID
			return out, err
		}
	})
	if err := adoptReceiver(ctx, billingDB, billing, pubSub, logger); err != nil {
		panic(err)
	}

	// The sending service.
	ordersDB := open("orders.db")
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

	msg := message.NewMessage(watermill.NewUUID(), []byte("order-1"))
	if err := orders.Publish("orders", msg); err != nil {
		panic(err)
	}
	<-seen
	<-confirmed
	// The same message again, as a broker's redelivery or a resend: the
	// inbox skips it and confirms it again.
	if err := pubSub.Publish("orders", msg.Copy()); err != nil {
		panic(err)
	}
	<-seen
	<-confirmed
	// The table deletes a record once it is complete (the default): what
	// is left is pending.
	var pending int
	if err := ordersDB.QueryRow("SELECT COUNT(*) FROM " + sqlstore.DefaultTable).Scan(&pending); err != nil {
		panic(err)
	}
	for _, r := range []*message.Router{billing, sender} {
		if err := r.Close(); err != nil {
			panic(err)
		}
	}
	fmt.Printf("charged order-1 %d time(s); %d record(s) pending at the sender\n", charged["order-1"], pending)
	// Output:
	// charged order-1 1 time(s); 0 record(s) pending at the sender
}
