package crashtest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// claimWindow is the children's replay ClaimGrace and stale resubmit
// window: the defaults' 5 minutes, cut so that a run stays short.
const claimWindow = 2 * time.Second

// ChildConfig is what a child service is built from.
type ChildConfig struct {
	// DB is the database of the record and handled tables.
	DB *sqlx.DB
	// Dialect is the store's dialect.
	Dialect *sqlstore.Dialect
	// Publisher returns the raw publisher of the service's broker; close
	// releases it.
	Publisher func() (pub message.Publisher, close func(), err error)
	// Subscriber returns the subscriber a handler reads from, by handler
	// (consumer) name: on a broker with a queue per consumer (RabbitMQ), a
	// subscriber of that consumer's queue; on one that gives every
	// subscription each message (GoChannel), it may be one subscriber for
	// all. The router closes it.
	Subscriber func(consumer string) (message.Subscriber, error)
}

// IsChild reports whether this process was started by [Run] to run test.
func IsChild(test string) bool { return os.Getenv(EnvChild) == test }

// Prepare creates the record table and its handled table for a run.
func Prepare(t *testing.T, db *sqlx.DB, d *sqlstore.Dialect, table string) {
	t.Helper()
	prepareRecords(t, db, d, table)
	// n orders the handlings: the cycle, then the child's count.
	if _, err := db.Exec("CREATE TABLE " + table + "_handled (uuid VARCHAR(64) NOT NULL, consumer VARCHAR(64) NOT NULL, n BIGINT NOT NULL, order_key VARCHAR(16) NOT NULL, record_id BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table + "_handled") })
}

// recordsMode is the completion of the record tables: marking, so that
// after a run the table still holds every record that was committed, which
// is how the summary counts them and finds the ones lost. The middleware
// runs with its defaults (or the checked path), which the completion mode
// does not change.
const recordsMode = sqlstore.Mark

// prepareRecords creates the record table, dropped when the test ends.
func prepareRecords(t *testing.T, db *sqlx.DB, d *sqlstore.Dialect, table string) {
	t.Helper()
	s, err := sqlstore.New(sqlstore.Config{Dialect: d, Table: table, DB: db, Completion: recordsMode})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + table + "_consumers")
		_, _ = db.Exec("DROP TABLE IF EXISTS " + table + "_seen")
		_, _ = db.Exec("DROP TABLE IF EXISTS " + table + "_declared")
		_, _ = db.Exec("DROP TABLE IF EXISTS " + table)
		_, _ = db.Exec(db.Rebind("DELETE FROM "+sqlstore.VersionTable+" WHERE table_name = ?"), table)
	})
}

// halt tells the parent where the child is and waits to be killed.
func halt(point Mode) {
	fmt.Printf("HALT %s\n", point)
	select {}
}

// Child runs the service until it is killed (or, in Drain mode, until
// nothing is pending). It never returns normally.
func Child(cfg ChildConfig) { exit(child(cfg)) }

// exit ends a child: 0 after a clean drain, 3 with the error on stderr.
func exit(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	os.Exit(0)
}

type childState struct {
	mode Mode
	at   int64
	// haltAfter, when set, arms the kill point at that time instead of at
	// its at-th pass: the first pass after it halts (envHaltAfter).
	haltAfter time.Time
	cycle     int
	batch     int
	ordered   bool
	// keys is the number of order keys of an ordered two-service run, in
	// which A publishes until it is killed (envKeys); 0 otherwise.
	keys int
	// checked checks every copy and completes before the ack (envChecked).
	checked  bool
	sends    atomic.Int64
	handles  atomic.Int64
	complets atomic.Int64
}

// stateFromEnv reads the kill point and the batch the parent chose.
func stateFromEnv() *childState {
	st := &childState{mode: Mode(os.Getenv(envMode)), at: int64(atoi(envAt)), cycle: atoi(envCycle), batch: atoi(envBatch),
		ordered: os.Getenv(envOrdered) == "1", checked: os.Getenv(envChecked) == "1", keys: atoi(envKeys)}
	if ms := atoi(envHaltAfter); ms > 0 {
		st.haltAfter = time.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	return st
}

// haltsAt reports whether the n-th pass (from 0) at the kill point mode is
// where the parent chose to kill the child.
func (st *childState) haltsAt(mode Mode, n int64) bool {
	if st.mode != mode {
		return false
	}
	if !st.haltAfter.IsZero() {
		return time.Now().After(st.haltAfter)
	}
	return n == st.at
}

func child(cfg ChildConfig) error {
	st := stateFromEnv()
	table := os.Getenv(envTable)
	topic, _ := Topics(table)
	var consumers []string
	if list := os.Getenv(envConsumers); list != "" {
		consumers = strings.Split(list, ",")
	}

	base, err := sqlstore.New(sqlstore.Config{Dialect: cfg.Dialect, Table: table, DB: cfg.DB, Completion: recordsMode})
	if err != nil {
		return err
	}
	store := &haltingStore{Store: base, st: st}
	tracked := outbox.Tracked{Topic: topic, Store: store, Consumers: consumers}
	if st.ordered {
		tracked.OrderKey = orderKey
	}
	reg, err := outbox.NewRegistry(tracked)
	if err != nil {
		return err
	}
	rawPub, closePub, err := cfg.Publisher()
	if err != nil {
		return err
	}
	defer closePub()

	router, err := newRouter(reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{FirstCopies: st.checked}, Complete: outbox.CompleteConfig{BeforeAck: st.checked}}, nil)
	if err != nil {
		return err
	}
	// The default replay by claims, with the stale resubmitter's window cut
	// from 5 minutes to 2 seconds so that a run stays short: a record that
	// a killed start claimed but did not get to the broker waits one
	// window, and is then sent again by the resubmitter or the next start.
	router.AddPlugin(outbox.ReplayPlugin(reg, rawPub, outbox.ReplayConfig{
		Resubmit: outbox.StaleResubmitterConfig{OlderThan: claimWindow, Interval: claimWindow / 4},
	}, nil))

	// mine is what each handler has still to handle of this cycle's batch.
	type pair struct{ handler, uuid string }
	mine := map[pair]bool{}
	for _, h := range handlers(consumers) {
		for i := 0; i < st.batch; i++ {
			mine[pair{h, uuidOf(st.cycle, i)}] = true
		}
	}
	var mu sync.Mutex
	allMine := make(chan struct{})
	insertHandled := cfg.DB.Rebind("INSERT INTO " + table + "_handled (uuid, consumer, n, order_key, record_id) VALUES (?, ?, ?, ?, ?)")
	for _, h := range handlers(consumers) {
		sub, err := cfg.Subscriber(h)
		if err != nil {
			return fmt.Errorf("subscriber of %s: %w", h, err)
		}
		router.AddNoPublisherHandler(h, topic, sub, func(msg *message.Message) error {
			n := st.handles.Add(1) - 1
			rec, _ := outbox.RecordFromContext(msg.Context())
			if _, err := cfg.DB.ExecContext(msg.Context(), insertHandled, msg.UUID, h, int64(st.cycle)*1_000_000+n, msg.Metadata.Get(orderKey), rec.ID); err != nil {
				return err
			}
			if st.haltsAt(MidHandler, n) {
				halt(MidHandler)
			}
			mu.Lock()
			if p := (pair{h, msg.UUID}); mine[p] {
				delete(mine, p)
				if len(mine) == 0 {
					close(allMine)
				}
			}
			mu.Unlock()
			return nil
		})
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr, err := runRouter(ctx, router)
	if err != nil {
		return err
	}

	if st.mode == Drain {
		if err := drainChild(ctx, router, base, topic); err != nil {
			return err
		}
		return reg.WaitCompletions(ctx)
	}

	pub, err := outbox.NewPublisher(reg, &haltingPublisher{Publisher: rawPub, st: st})
	if err != nil {
		return err
	}
	if err := publishBatch(pub, topic, st); err != nil {
		return err
	}
	select {
	case <-allMine:
	case err := <-runErr:
		return fmt.Errorf("router stopped: %v", err)
	}
	fmt.Println("IDLE")
	select {} // wait for the kill
}

// newRouter returns a router with the outbox middleware of reg.
func newRouter(reg *outbox.Registry, cfg outbox.MiddlewareConfig, logger watermill.LoggerAdapter) (*message.Router, error) {
	mw, err := outbox.NewMiddleware(reg, cfg, logger)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(mw)
	return router, nil
}

// runRouter runs the router until ctx is done and returns once it is
// running; the channel gets Run's result.
func runRouter(ctx context.Context, router *message.Router) (<-chan error, error) {
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-router.Running():
		return runErr, nil
	case err := <-runErr:
		return nil, fmt.Errorf("router: %w", err)
	}
}

// publishBatch publishes the cycle's batch of tracked messages.
func publishBatch(pub message.Publisher, topic string, st *childState) error {
	for i := 0; i < st.batch; i++ {
		msg := message.NewMessage(uuidOf(st.cycle, i), []byte(strconv.Itoa(i)))
		msg.Metadata.Set(orderKey, fmt.Sprintf("k%d", (st.cycle*st.batch+i)%OrderKeys))
		if err := pub.Publish(topic, msg); err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
	}
	return nil
}

// drainChild waits until nothing is pending. A long soak leaves a deep
// backlog of copies on a persistent broker, so it fails only when the
// pending count stops going down for a minute.
func drainChild(ctx context.Context, router *message.Router, store *sqlstore.Store, topic string) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	best, stalledSince := -1, time.Now()
	for {
		recs, err := store.PendingAfter(ctx, topic, 0, 100_000)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			fmt.Println("DRAINED")
			return router.Close()
		}
		if best < 0 || len(recs) < best {
			best, stalledSince = len(recs), time.Now()
		}
		if time.Since(stalledSince) > time.Minute {
			return fmt.Errorf("%d records pending, none completed for a minute (first: %d)", len(recs), recs[0].ID)
		}
		<-tick.C
	}
}

// orderKey is the metadata key of an ordered run's order keys.
const orderKey = "order_key"

func uuidOf(cycle, i int) string { return fmt.Sprintf("c%04d-m%03d", cycle, i) }

func atoi(env string) int {
	n, _ := strconv.Atoi(os.Getenv(env))
	return n
}

// haltingPublisher halts between the insert and the send.
type haltingPublisher struct {
	message.Publisher
	st *childState
}

func (p *haltingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if n := p.st.sends.Add(1) - 1; p.st.haltsAt(AfterInsert, n) {
		halt(AfterInsert)
	}
	return p.Publisher.Publish(topic, msgs...)
}

// haltingStore halts between the handler and the mark.
type haltingStore struct {
	*sqlstore.Store
	st *childState
}

func (s *haltingStore) Complete(ctx context.Context, d recordstore.Delivery) error {
	if n := s.st.complets.Add(1) - 1; s.st.haltsAt(BeforeMark, n) {
		halt(BeforeMark)
	}
	return s.Store.Complete(ctx, d)
}
