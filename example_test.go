package outbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// exampleStore opens a SQLite file in a temp dir with its outbox table.
func exampleStore() (*sqlstore.Store, func()) {
	dir, _ := os.MkdirTemp("", "outbox-example")
	db := sqlx.MustOpen("sqlite", "file:"+filepath.Join(dir, "outbox.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	db.SetMaxOpenConns(1)
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	return store, func() { db.Close(); os.RemoveAll(dir) }
}

// Adopting the outbox in an existing router takes a registry and three lines:
// the middleware, the publisher decorator and the replay plugin.
func Example() {
	store, cleanup := exampleStore()
	defer cleanup()

	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	if err != nil {
		panic(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})

	mw, _ := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	router.AddMiddleware(mw)                                                       // completes records
	router.AddPublisherDecorators(outbox.PublisherDecorator(reg))                  // records handler output
	router.AddPlugin(outbox.ReplayPlugin(reg, pubSub, outbox.ReplayConfig{}, nil)) // replays at start

	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	router.AddNoPublisherHandler("ship", "orders", pubSub, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(msg.Payload))
		if len(got) == 2 {
			close(done)
		}
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	pub, _ := outbox.NewPublisher(reg, pubSub)
	_ = pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("order 1")), message.NewMessage(watermill.NewUUID(), []byte("order 2")))
	<-done
	_ = router.Close()

	sort.Strings(got)
	pending, _ := store.PendingAfter(context.Background(), "orders", 0, 10)
	fmt.Println(got, "pending:", len(pending))
	// Output: [order 1 order 2] pending: 0
}

// A publisher that crashed after saving its records: the restarted service
// replays them once its subscriptions are open.
func ExampleReplay() {
	store, cleanup := exampleStore()
	defer cleanup()
	reg, _ := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})

	// The records were saved, the messages were lost with the process.
	lost := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	pub, _ := outbox.NewPublisher(reg, lost)
	_ = pub.Publish("orders", message.NewMessage("order-7", []byte("order 7")))
	_ = lost.Close()

	fresh := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
	sub, _ := fresh.Subscribe(context.Background(), "orders") // subscriptions first
	result, err := outbox.Replay(context.Background(), reg, fresh, outbox.ReplayConfig{}, nil)
	if err != nil {
		panic(err)
	}
	msg := <-sub
	msg.Ack()
	fmt.Println(result.Total(), msg.UUID, string(msg.Payload), msg.Metadata.Get(outbox.MetadataTopic))
	// Output: 1 order-7 order 7 orders
}

// A handler discards a message it can never process with outbox.Drop: the
// record is completed and the message acknowledged.
func ExampleDrop() {
	err := outbox.Drop(fmt.Errorf("order %q has no lines", "order-9"))
	fmt.Println(outbox.IsDrop(err))
	fmt.Println(err)
	// Output:
	// true
	// outbox: message dropped: order "order-9" has no lines
}

// The fast path: messages go once their handler succeeded and their
// completions follow in the background, gathered into one statement, and
// the first copy of each record this process published runs without the
// check. WaitCompletions, after the router closed, lets the last
// completions commit before the service exits.
func ExampleRegistry_WaitCompletions() {
	store, cleanup := exampleStore()
	defer cleanup()

	reg, _ := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	mw, _ := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	router.AddMiddleware(mw)

	var handled sync.WaitGroup
	handled.Add(3)
	router.AddNoPublisherHandler("ship", "orders", pubSub, func(*message.Message) error {
		handled.Done()
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	pub, _ := outbox.NewPublisher(reg, pubSub)
	for i := 1; i <= 3; i++ {
		_ = pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("order %d", i))))
	}
	handled.Wait()
	_ = router.Close()
	if err := reg.WaitCompletions(context.Background()); err != nil {
		panic(err)
	}

	pending, _ := store.PendingAfter(context.Background(), "orders", 0, 10)
	fmt.Println("pending:", len(pending))
	// Output: pending: 0
}
