// Command demo shows the outbox on its embedded default, SQLite and
// GoChannel, with no server: a publisher process saves three orders and is
// killed before anyone consumes them; the restarted service replays the
// pending records and handles each order once.
//
//	go run ./_examples/demo
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

const topic = "orders"

func main() {
	role := flag.String("role", "demo", "demo (run everything), publisher (publish then crash)")
	dbPath := flag.String("db", "", "SQLite file (default: a fresh file in a temp dir)")
	flag.Parse()
	if err := run(*role, *dbPath); err != nil {
		log.Fatal(err)
	}
}

func run(role, dbPath string) error {
	if dbPath == "" {
		dir, err := os.MkdirTemp("", "outbox-demo")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dbPath = filepath.Join(dir, "outbox.db")
	}
	switch role {
	case "publisher":
		return publishThenCrash(dbPath)
	case "demo":
		return demo(dbPath)
	default:
		return fmt.Errorf("unknown role %q", role)
	}
}

// wiring is what both processes build: the store, the registry and a
// GoChannel, which keeps nothing when its process dies.
func wiring(dbPath string) (*sqlx.DB, *sqlstore.Store, *outbox.Registry, error) {
	db, err := sqlx.Open("sqlite", "file:"+dbPath+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		return nil, nil, nil, err
	}
	db.SetMaxOpenConns(1) // SQLite has one writer; see the sqlstore docs
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: db})
	if err != nil {
		return nil, nil, nil, err
	}
	if err := store.Migrate(context.Background()); err != nil {
		return nil, nil, nil, err
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store})
	return db, store, reg, err
}

func publishThenCrash(dbPath string) error {
	_, _, reg, err := wiring(dbPath)
	if err != nil {
		return err
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	pub, err := outbox.NewPublisher(reg, pubSub)
	if err != nil {
		return err
	}
	for _, id := range []string{"order-1", "order-2", "order-3"} {
		if err := pub.Publish(topic, message.NewMessage(id, []byte(`{"order":"`+id+`"}`))); err != nil {
			return err
		}
		fmt.Printf("publisher: saved and sent %s\n", id)
	}
	fmt.Println("publisher: crashing before anyone consumed the messages")
	return syscall.Kill(os.Getpid(), syscall.SIGKILL)
}

func demo(dbPath string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self, "-role", "publisher", "-db", dbPath)
	child.Stdout, child.Stderr = os.Stdout, os.Stderr
	err = child.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		return fmt.Errorf("the publisher was expected to be killed, got: %v", err)
	}
	fmt.Printf("demo: publisher process died (%v)\n", exitErr)

	db, store, reg, err := wiring(dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	pending, err := store.PendingAfter(context.Background(), topic, 0, 100)
	if err != nil {
		return err
	}
	fmt.Printf("demo: %d records pending after the crash\n", len(pending))

	// The restarted service: an existing router, plus the outbox's three lines.
	logger := watermill.NewStdLogger(false, false)
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(mw)
	router.AddPublisherDecorators(outbox.PublisherDecorator(reg))
	router.AddPlugin(outbox.ReplayPlugin(reg, pubSub, outbox.ReplayConfig{}, logger))

	var mu sync.Mutex
	handled := map[string]int{}
	all := make(chan struct{})
	router.AddNoPublisherHandler("ship_orders", topic, pubSub, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled[msg.UUID]++
		fmt.Printf("service: handled %s %s\n", msg.UUID, msg.Payload)
		if len(handled) == len(pending) {
			close(all)
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-all:
	case err := <-runErr:
		return fmt.Errorf("router stopped: %v", err)
	case <-ctx.Done():
		return errors.New("timed out waiting for the replayed messages")
	}
	if err := router.Close(); err != nil {
		return err
	}
	if err := <-runErr; err != nil {
		return err
	}

	left, err := store.PendingAfter(context.Background(), topic, 0, 100)
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(handled))
	once := true
	for id, n := range handled {
		ids = append(ids, id)
		once = once && n == 1
	}
	sort.Strings(ids)
	fmt.Printf("demo: handled %d messages %v, each once: %v; %d records pending\n", len(ids), ids, once, len(left))
	if !once || len(left) != 0 || len(ids) != len(pending) {
		return errors.New("demo: the outbox did not deliver every message exactly once")
	}
	return nil
}
