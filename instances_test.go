package outbox_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// instance is one service process: its own pool, store, registry and
// middleware, on a table it shares with the other instances.
type instance struct {
	db    *sqlx.DB
	store *sqlstore.Store
	reg   *outbox.Registry
	mw    message.HandlerMiddleware
}

// instances builds n instances of one service on one fresh table (on SQLite
// one database file, a pool of one connection each), with an effects table
// for the handlers. The returned bundle is the first instance's.
func instances(t *testing.T, backend testenv.Backend, n int, lease time.Duration) (*bundle, []*instance, string) {
	t.Helper()
	// These tests count effects, not what survives a power cut: commits
	// skip the disk flush where the database allows it per connection, so
	// that ten thousand of them take seconds, not minutes.
	open := backend.Open
	switch backend.Name {
	case "SQLite":
		dsn := testenv.SQLiteDSN(t) + "&_pragma=synchronous(OFF)"
		open = func(tb testing.TB) *sqlx.DB {
			db := testenv.Open(tb, "SQLite", "sqlite", dsn)
			db.SetMaxOpenConns(1)
			return db
		}
	case "Postgres":
		dsn := testenv.PostgresDSN()
		open = func(tb testing.TB) *sqlx.DB {
			db := testenv.Open(tb, "PostgreSQL", "pgx", dsn+querySep(dsn)+"synchronous_commit=off")
			db.SetMaxOpenConns(10)
			db.SetMaxIdleConns(10)
			return db
		}
	}
	table := testenv.Table(t)
	topic := "orders_" + table
	// The router runs every replayed delivery at once; on a small pool a
	// mark can queue for longer than the default Complete.Timeout.
	logger := &testenv.CaptureLogger{}
	out := make([]*instance, n)
	for i := range out {
		db := open(t)
		store, err := sqlstore.New(sqlstore.Config{Dialect: backend.Dialect, Table: table, DB: db, Lease: lease})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		require.NoError(t, store.Migrate(ctx))
		cancel()
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store})
		require.NoError(t, err)
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Complete: outbox.CompleteConfig{Timeout: 2 * time.Minute}, Backoff: redeliverAtOnce}, logger)
		require.NoError(t, err)
		out[i] = &instance{db: db, store: store, reg: reg, mw: settledMiddleware(t, context.Background(), reg, mw)}
	}
	t.Cleanup(func() { testenv.DropTable(t, out[0].db, backend.Dialect, table) })
	b := &bundle{backend: backend, db: out[0].db, store: out[0].store, reg: out[0].reg, topic: topic, logger: logger}
	return b, out, effectsTable(t, b)
}

// backlog saves n pending records, as a crash before any send leaves them.
func (b *bundle) backlog(t *testing.T, n int) {
	t.Helper()
	for start := 0; start < n; start += 1000 {
		recs := make([]recordstore.Record, min(1000, n-start))
		for i := range recs {
			recs[i] = recordstore.Record{Topic: b.topic, UUID: watermillUUID(start + i), Payload: []byte("p")}
		}
		require.NoError(t, b.store.Insert(b.ctx(t), recs))
	}
}

func querySep(dsn string) string {
	if strings.Contains(dsn, "?") {
		return "&"
	}
	return "?"
}

// replayTogether starts every instance at once, each replaying the
// backlog into a broker of its own and handling it with handlers[i], and
// waits until every copy the replays sent was acknowledged. Each record is
// sent by every instance whose replay read it before another instance
// completed it: up to len(inst) copies, at about the same moment. It
// returns the deliveries acknowledged and those nacked (and redelivered).
func replayTogether(t *testing.T, b *bundle, inst []*instance, handlers []func(*message.Message) error, backlog int) (acked, nacked int64) {
	t.Helper()
	counter := &ackCounter{changed: make(chan struct{}, 1)}
	var failed atomic.Int64
	routers := make([]*message.Router, len(inst))
	sends := make([]*countingPublisher, len(inst))
	for i, in := range inst {
		broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		t.Cleanup(func() { _ = broker.Close() })
		sends[i] = &countingPublisher{Publisher: broker}
		r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		r.AddMiddleware(counter.ackedOnly(&failed), in.mw)
		r.AddPlugin(outbox.ReplayPlugin(in.reg, sends[i], outbox.ReplayConfig{PageSize: 500}, nil))
		r.AddNoPublisherHandler("consume", b.topic, broker, handlers[i])
		routers[i] = r
	}
	var wg sync.WaitGroup
	for _, r := range routers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, r.Run(context.Background()))
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The replay runs while the router subscribes, before it is running:
	// once every router runs, the copies sent are known.
	sent := 0
	for i, r := range routers {
		select {
		case <-r.Running():
		case <-ctx.Done():
			t.Fatalf("router %d did not start", i)
		}
		_, copies := sends[i].counts()
		sent += copies
	}
	require.GreaterOrEqual(t, sent, backlog, "every record was sent by some instance")
	for counter.n.Load() < int64(sent) {
		select {
		case <-counter.changed:
		case <-ctx.Done():
			t.Fatalf("%d of %d deliveries acked", counter.n.Load(), sent)
		}
	}
	for _, r := range routers {
		require.NoError(t, r.Close())
	}
	wg.Wait()
	return counter.n.Load(), failed.Load()
}

// ackCounter counts acknowledged deliveries and signals each change.
type ackCounter struct {
	n       atomic.Int64
	changed chan struct{}
}

// ackedOnly counts the deliveries that the inner chain acknowledged, and
// those it nacked in failed.
func (d *ackCounter) ackedOnly(failed *atomic.Int64) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				failed.Add(1)
				return out, err
			}
			d.n.Add(1)
			select {
			case d.changed <- struct{}{}:
			default: // a signal is already waiting
			}
			return out, err
		}
	}
}
