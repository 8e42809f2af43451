package main

// The remote case: what order by key costs when the consumer is in another
// service. Service A saves and sends a tracked topic whose one consumer,
// billing, is service B's, with a database of its own: B keeps an inbox
// there, writes each message's effect with its inbox entry in one
// transaction (outbox.InboxTx) and confirms to A over the broker. With an
// OrderKey, A stamps each message with its key's earlier message and B
// holds a message whose earlier one it has not handled, reporting it to A,
// which sends it again once it can run.
//
// Two brokers: RabbitMQ, one durable queue per topic with one consumer,
// which delivers in the order A sent (one message at a time, the next once
// the last is acked); and GoChannel, which hands each message of a Publish
// to a goroutine of its own, so the subscriber gets them in no set order.
// GoChannel's BlockPublishUntilSubscriberAck would keep the order of a
// Publish, but A's confirmation handler, sending a held message again, then
// waits on B, whose handler waits on its confirmation to A: it deadlocks.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/sqlstore"
)

// remoteCost are the columns of the remote case: each side's commits and
// statements (round trips) its pool sent, the
// held confirmations B sent and the records A sent again, per message; WAL
// and server CPU are the whole server's, both sides together.
var remoteCost = []costColumn{
	{"commits_a", "A commits/msg", "%.2f"},
	{"commits_b", "B commits/msg", "%.2f"},
	{"stmts_a", "A statements/msg", "%.2f"},
	{"stmts_b", "B statements/msg", "%.2f"},
	{"held", "held/msg", "%.3f"},
	{"resent", "resent/msg", "%.3f"},
	{"wal", "WAL B/msg, A+B", "%.0f"},
	{"cpu", "DB CPU ms/msg, A+B", "%.3f"},
}

// remoteWorkload is n messages over keys keys, message i of key i%keys,
// perPublish to a Publish call, from publishers taking batches in turn.
type remoteWorkload struct {
	n, keys, perPublish, publishers int
}

func (w remoteWorkload) keyOf(i int) string { return strconv.Itoa(i % w.keys) }

// remoteConsumer is B's handler, A's remote consumer.
const remoteConsumer = "billing"

// remoteStall ends a remote case in which no record completed for that
// long: above the stale resubmitter's default ConfirmWithin (30 s) and a
// scan (every 10 s), so that a message left to it still counts.
const remoteStall = 45 * time.Second

// remoteBroker opens the broker of one case: A's publisher and
// confirmation subscriber, B's subscriber and confirmation publisher.
type remoteBroker struct {
	name string
	open func(ctx context.Context, topic, confirmTopic string) (brokerSides, error)
}

type brokerSides struct {
	pubA, pubB        message.Publisher
	confirmsA, orders message.Subscriber
	close             func()
}

// keepOpen is a subscriber its router does not close: the routers of A and
// B share one GoChannel, closed once both stopped.
type keepOpen struct{ message.Subscriber }

func (keepOpen) Close() error { return nil }

func goChannelBroker() remoteBroker {
	return remoteBroker{name: "GoChannel (reorders)", open: func(context.Context, string, string) (brokerSides, error) {
		gc := newGoChannel()
		return brokerSides{pubA: gc, pubB: gc, confirmsA: keepOpen{gc}, orders: keepOpen{gc}, close: func() { _ = gc.Close() }}, nil
	}}
}

// rabbitBroker is RabbitMQ with a durable queue per topic and one consumer
// on each, through watermill-amqp v3; the queues are deleted after the case.
func rabbitBroker(uri string) remoteBroker {
	return remoteBroker{name: "RabbitMQ, one queue, one consumer (keeps order)", open: func(ctx context.Context, topic, confirmTopic string) (brokerSides, error) {
		cfg := amqp.NewDurableQueueConfig(uri)
		var s brokerSides
		var closers []func() error
		s.close = func() {
			for _, c := range closers {
				_ = c()
			}
			if conn, err := amqp091.Dial(uri); err == nil {
				if ch, err := conn.Channel(); err == nil {
					_, _ = ch.QueueDelete(topic, false, false, false)
					_, _ = ch.QueueDelete(confirmTopic, false, false, false)
				}
				_ = conn.Close()
			}
		}
		for _, p := range []*message.Publisher{&s.pubA, &s.pubB} {
			pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
			if err != nil {
				s.close()
				return brokerSides{}, fmt.Errorf("RabbitMQ publisher: %w", err)
			}
			closers = append(closers, pub.Close)
			*p = pub
		}
		for _, sub := range []*message.Subscriber{&s.confirmsA, &s.orders} {
			sb, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
			if err != nil {
				s.close()
				return brokerSides{}, fmt.Errorf("RabbitMQ subscriber: %w", err)
			}
			closers = append(closers, sb.Close)
			*sub = sb
		}
		return s, nil
	}}
}

// remoteSteps compares, on each broker, the topic with remote consumers
// ordered by key against the same topic unordered. PostgreSQL only: B's
// database is a second database of the server.
func remoteSteps(ctx context.Context, d *database, o options, rep *report) error {
	if d.name != "postgres" {
		return nil
	}
	n := max(o.saturatedN, 100)
	w := remoteWorkload{n: n, keys: max(n/10, 1), perPublish: 50, publishers: 4}
	env, err := openRemoteEnv(ctx, d, o.dsn.postgres)
	if err != nil {
		return err
	}
	defer env.close()
	brokers := []remoteBroker{goChannelBroker()}
	if conn, err := amqp091.Dial(o.amqpURI); err == nil {
		_ = conn.Close()
		brokers = append([]remoteBroker{rabbitBroker(o.amqpURI)}, brokers...)
	} else {
		rep.notApplicable("remote on RabbitMQ", fmt.Sprintf("RabbitMQ is not reachable at %s: %v", o.amqpURI, err))
	}
	for _, b := range brokers {
		rs, err := sideBySide(o.saturatedRounds,
			func() (result, error) { return remoteCase(ctx, d, env, b, w, false) },
			func() (result, error) { return remoteCase(ctx, d, env, b, w, true) },
		)
		if err != nil {
			return fmt.Errorf("remote on %s: %w", b.name, err)
		}
		group := fmt.Sprintf("remote, %d messages, %d keys in turn, %d per Publish, %s", w.n, w.keys, w.perPublish, b.name)
		rep.addWith(remoteCost, group, "unordered", w.publishers, rs[0], "msg/s")
		rep.addWith(remoteCost, group, "ordered (OrderKey)", w.publishers, rs[1], "msg/s")
		rep.compare("remote on "+b.name+": ordered / unordered", rs[1], rs[0])
	}
	return nil
}

// remoteEnv is what the remote cases share: B's database (the name of A's
// with "_b", created when missing) and the connection settings of both.
type remoteEnv struct {
	cfgA, cfgB *pgx.ConnConfig
	// adminB runs B's setup and clean-up, unmetered; it keeps no idle
	// connection, so that its statistics reach the server as it closes
	// each.
	adminB *sqlx.DB
}

func openRemoteEnv(ctx context.Context, d *database, dsn string) (*remoteEnv, error) {
	cfgA, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("remote: parsing the PostgreSQL DSN: %w", err)
	}
	cfgB := cfgA.Copy()
	cfgB.Database = cfgA.Database + "_b"
	var exists bool
	if err := d.db.GetContext(ctx, &exists, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", cfgB.Database); err != nil {
		return nil, fmt.Errorf("remote: looking for database %s: %w", cfgB.Database, err)
	}
	if !exists {
		if _, err := d.db.ExecContext(ctx, "CREATE DATABASE "+pgx.Identifier{cfgB.Database}.Sanitize()); err != nil {
			return nil, fmt.Errorf("remote: creating database %s for service B: %w", cfgB.Database, err)
		}
	}
	admin := sqlx.NewDb(stdlib.OpenDB(*cfgB.Copy()), "pgx")
	admin.SetMaxIdleConns(0)
	for _, c := range []*pgx.ConnConfig{cfgA, cfgB} {
		c.RuntimeParams["application_name"] = benchApplication
	}
	return &remoteEnv{cfgA: cfgA, cfgB: cfgB, adminB: admin}, nil
}

func (e *remoteEnv) close() { _ = e.adminB.Close() }

// statementCounter counts the statements, BEGIN, COMMIT and ROLLBACK
// included, and the explicit prepares a pool's connections send: a round
// trip each. It counts the commits too, as PostgreSQL does (a statement
// outside a transaction is one, read-only or not), so that a side's
// commits are its own even when others use its database.
type statementCounter struct{ n, commits atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	sql := strings.ToLower(strings.TrimSpace(data.SQL))
	switch {
	case sql == "commit":
		c.commits.Add(1)
	case conn.PgConn().TxStatus() == 'I' && !strings.HasPrefix(sql, "begin"):
		c.commits.Add(1)
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TracePrepareStart(ctx context.Context, conn *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.n.Add(1)
	if conn.PgConn().TxStatus() == 'I' {
		c.commits.Add(1)
	}
	return ctx
}

func (c *statementCounter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// countedPool opens a pool of the case's size on cfg whose statements c
// counts.
func countedPool(cfg *pgx.ConnConfig, c *statementCounter) *sqlx.DB {
	cc := cfg.Copy()
	cc.Tracer = c
	db := sqlx.NewDb(sql.OpenDB(stdlib.GetConnector(*cc)), "pgx")
	db.SetMaxOpenConns(poolSize)
	db.SetMaxIdleConns(poolSize)
	return db
}

// remoteObserver counts A's completions and resends.
type remoteObserver struct {
	completed, resent atomic.Int64
	lastCompleted     atomic.Int64
	progress          chan struct{}
}

func (o *remoteObserver) Published(string, int) {}
func (o *remoteObserver) Completed(string, string) {
	o.completed.Add(1)
	o.lastCompleted.Store(time.Now().UnixNano())
	select {
	case o.progress <- struct{}{}:
	default:
	}
}
func (*remoteObserver) DuplicateSkipped(string, string)                {}
func (*remoteObserver) Failed(string, string)                          {}
func (*remoteObserver) Abandoned(string, string)                       {}
func (o *remoteObserver) Resent(_ string, _ observe.ResendKind, n int) { o.resent.Add(int64(n)) }
func (*remoteObserver) NotOwned(string, string)                        {}
func (*remoteObserver) UnknownRecord(string, string)                   {}
func (*remoteObserver) Mismatched(string, string)                      {}

// heldCounter is B's confirmation publisher, counting the confirmations
// that report a held message (held_id).
type heldCounter struct {
	message.Publisher
	held atomic.Int64
}

func (h *heldCounter) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		var c struct {
			HeldID int64 `json:"held_id"`
		}
		if json.Unmarshal(m.Payload, &c) == nil && c.HeldID != 0 {
			h.held.Add(1)
		}
	}
	return h.Publisher.Publish(topic, msgs...)
}

// remoteReading is one reading of both sides' counters.
type remoteReading struct {
	commitsA, commitsB, wal, cpu float64
	// stmts and commits are the pools' own counts.
	stmtsA, stmtsB, ownA, ownB int64
}

func (e *remoteEnv) read(ctx context.Context, d *database, stmtsA, stmtsB *statementCounter) (remoteReading, error) {
	r := remoteReading{stmtsA: stmtsA.n.Load(), stmtsB: stmtsB.n.Load(), ownA: stmtsA.commits.Load(), ownB: stmtsB.commits.Load()}
	err := d.meter.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8,
  (SELECT xact_commit::float8 FROM pg_stat_database WHERE datname = $1),
  (SELECT xact_commit::float8 FROM pg_stat_database WHERE datname = $2)`, e.cfgA.Database, e.cfgB.Database).Scan(&r.wal, &r.commitsA, &r.commitsB)
	if err != nil {
		return r, fmt.Errorf("remote: reading the databases' counters: %w", err)
	}
	if d.serverPID > 0 {
		r.cpu, _ = serverCPU(d.serverPID, true)
	}
	return r, nil
}

// remoteCase runs one workload from A to B over the broker, ordered by key
// or not, every option at its default, and measures the rate until A
// completed every record. B checks that each key's messages ran in the
// order A saved them: on the ordered topic, an inversion fails the case.
func remoteCase(ctx context.Context, d *database, env *remoteEnv, b remoteBroker, w remoteWorkload, ordered bool) (res result, err error) {
	var raw [4]byte
	_, _ = rand.Read(raw[:])
	suffix := hex.EncodeToString(raw[:])
	topic, confirmTopic := "bench_remote_"+suffix, "bench_remote_confirm_"+suffix
	var stmtsA, stmtsB statementCounter
	poolA, poolB := countedPool(env.cfgA, &stmtsA), countedPool(env.cfgB, &stmtsB)
	defer func() { _ = poolA.Close(); _ = poolB.Close() }()

	// A: the record table, the tracked topic, a router with the
	// confirmation handler and the replay plugin (whose stale resubmitter
	// sends held messages again).
	store, err := sqlstore.New(sqlstore.Config{Dialect: d.dialect, Table: "bench_" + suffix, DB: poolA})
	if err != nil {
		return result{}, err
	}
	if err := store.Migrate(ctx); err != nil {
		return result{}, err
	}
	defer d.drop(context.Background(), store)
	// B: the inbox and the table of effects.
	inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: d.dialect, DB: poolB, Table: "bench_inbox_" + suffix})
	if err != nil {
		return result{}, err
	}
	if err := inbox.Migrate(ctx); err != nil {
		return result{}, err
	}
	effects := "bench_effects_" + suffix
	defer func() {
		bg := context.Background()
		_, _ = env.adminB.ExecContext(bg, "DROP TABLE IF EXISTS "+effects)
		_, _ = env.adminB.ExecContext(bg, "DROP TABLE IF EXISTS "+inbox.Table())
		_, _ = env.adminB.ExecContext(bg, "DELETE FROM "+sqlstore.VersionTable+" WHERE table_name = $1", inbox.Table())
	}()
	if _, err := poolB.ExecContext(ctx, "CREATE TABLE "+effects+" (k TEXT NOT NULL, record BIGINT NOT NULL)"); err != nil {
		return result{}, err
	}

	sides, err := b.open(ctx, topic, confirmTopic)
	if err != nil {
		return result{}, err
	}
	defer sides.close()

	tracked := outbox.Tracked{Topic: topic, Store: store, RemoteConsumers: []string{remoteConsumer}, ConfirmTopic: confirmTopic}
	if ordered {
		tracked.OrderKey = orderedKey
	}
	regA, err := outbox.NewRegistry(tracked)
	if err != nil {
		return result{}, err
	}
	obs := &remoteObserver{progress: make(chan struct{}, 1)}
	regA.SetObserver(obs)
	routerA, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return result{}, err
	}
	mwA, err := outbox.NewMiddleware(regA, outbox.MiddlewareConfig{}, nil)
	if err != nil {
		return result{}, err
	}
	routerA.AddMiddleware(mwA)
	routerA.AddPlugin(outbox.ReplayPlugin(regA, sides.pubA, outbox.ReplayConfig{}, nil))
	if err := outbox.AddConfirmationHandler(routerA, regA, sides.confirmsA, nil); err != nil {
		return result{}, err
	}
	pubA, err := outbox.NewPublisher(regA, sides.pubA)
	if err != nil {
		return result{}, err
	}

	regB, err := outbox.NewRegistry()
	if err != nil {
		return result{}, err
	}
	confirmations := &heldCounter{Publisher: sides.pubB}
	mwB, err := outbox.NewMiddleware(regB, outbox.MiddlewareConfig{Inbox: inbox, Confirmations: confirmations}, nil)
	if err != nil {
		return result{}, err
	}
	routerB, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return result{}, err
	}
	routerB.AddMiddleware(mwB)
	var (
		mu         sync.Mutex
		last       = map[string]int64{}
		inversions int
	)
	insert := "INSERT INTO " + effects + " (k, record) VALUES ($1, $2)"
	routerB.AddNoPublisherHandler(remoteConsumer, topic, sides.orders, func(msg *message.Message) error {
		ctx := msg.Context()
		tx, err := poolB.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		switch err := outbox.InboxTx(ctx, tx, msg); {
		case errors.Is(err, outbox.ErrAlreadyHandled):
			return nil
		case err != nil:
			return err
		}
		key := msg.Metadata.Get(orderedKey)
		id, _ := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataID), 10, 64)
		if _, err := tx.ExecContext(ctx, insert, key, id); err != nil {
			return err
		}
		// Before the commit: the next message of the key can run only
		// once this one's inbox entry committed.
		mu.Lock()
		if id < last[key] {
			inversions++
		}
		last[key] = max(last[key], id)
		mu.Unlock()
		return tx.Commit()
	})

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var running []*message.Router
	var runErrs []chan error
	defer func() {
		for i, r := range running {
			_ = r.Close()
			if rerr := <-runErrs[i]; rerr != nil && err == nil {
				err = fmt.Errorf("router: %w", rerr)
			}
		}
	}()
	for _, r := range []*message.Router{routerB, routerA} {
		runErr := make(chan error, 1)
		go func() { runErr <- r.Run(runCtx) }()
		select {
		case <-r.Running():
			running, runErrs = append(running, r), append(runErrs, runErr)
		case err := <-runErr:
			return result{}, fmt.Errorf("router: %w", err)
		}
	}

	before, err := env.read(ctx, d, &stmtsA, &stmtsB)
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	obs.lastCompleted.Store(start.UnixNano())
	failed, firstErr := publishKeyed(pubA, topic, w.n, w.perPublish, w.publishers, w.keyOf)
	want := int64(w.n) - failed
	for obs.completed.Load() < want {
		select {
		case <-obs.progress:
		case <-time.After(100 * time.Millisecond):
			if time.Since(time.Unix(0, obs.lastCompleted.Load())) > remoteStall {
				want = obs.completed.Load()
			}
		}
	}
	completed := obs.completed.Load()
	elapsed := time.Unix(0, obs.lastCompleted.Load()).Sub(start)
	for i, r := range running {
		if err := r.Close(); err != nil {
			return result{}, err
		}
		if err := <-runErrs[i]; err != nil {
			return result{}, fmt.Errorf("router: %w", err)
		}
	}
	running = nil
	for _, reg := range []*outbox.Registry{regA, regB} {
		if err := reg.WaitCompletions(ctx); err != nil {
			return result{}, err
		}
	}
	// Every backend of the case's pools reports its counters as it exits.
	_ = poolA.Close()
	_ = poolB.Close()
	if err := d.closeBackends(ctx); err != nil {
		return result{}, err
	}
	after, err := env.read(ctx, d, &stmtsA, &stmtsB)
	if err != nil {
		return result{}, err
	}
	if completed == 0 {
		return result{}, errors.Join(errors.New("no record was completed"), firstErr)
	}
	per := func(v float64) float64 { return v / float64(completed) }
	res = result{rate: float64(completed) / elapsed.Seconds(), errors: failed, firstErr: firstErr, lost: int64(w.n) - failed - completed,
		cost: map[string]float64{
			"commits_a": per(float64(after.ownA - before.ownA)),
			"commits_b": per(float64(after.ownB - before.ownB)),
			"stmts_a":   per(float64(after.stmtsA - before.stmtsA)),
			"stmts_b":   per(float64(after.stmtsB - before.stmtsB)),
			"held":      per(float64(confirmations.held.Load())),
			"resent":    per(float64(obs.resent.Load())),
			"wal":       per(after.wal - before.wal),
		}}
	if d.serverPID > 0 {
		res.cost["cpu"] = per(after.cpu - before.cpu)
	}
	// The server's count of each database's commits: B's is B's alone, A's
	// has whatever else runs on its database.
	res.note = fmt.Sprintf("pg_stat_database commits/msg: A %.2f, B %.2f", per(after.commitsA-before.commitsA), per(after.commitsB-before.commitsB))
	mu.Lock()
	defer mu.Unlock()
	if inversions > 0 {
		if ordered {
			return res, fmt.Errorf("%d messages ran at B before an earlier message of their key", inversions)
		}
		res.note += fmt.Sprintf("; %d ran before an earlier message of their key", inversions)
	}
	return res, nil
}
