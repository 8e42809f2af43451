package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/faultproxy"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// guard is how long a test waits for something that should happen at once
// before it fails: a failure guard, never a measure of speed.
const guard = 20 * time.Second

// outcomes is an outer middleware that records what the chain inside it
// returned, delivery by delivery, panics included.
type outcomes struct {
	mu         sync.Mutex
	deliveries int
	errs       []error
}

func (o *outcomes) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (_ []*message.Message, err error) {
		defer func() {
			p := recover()
			o.mu.Lock()
			o.deliveries++
			if p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
			if err != nil {
				o.errs = append(o.errs, err)
			}
			o.mu.Unlock()
			if p != nil {
				panic(p)
			}
		}()
		return h(msg)
	}
}

func (o *outcomes) snapshot() (deliveries int, errs []error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deliveries, append([]error(nil), o.errs...)
}

// nacked reports whether msg has been nacked.
func nacked(msg *message.Message) bool {
	select {
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}

// runCounter counts handler runs.
type runCounter struct {
	mu   sync.Mutex
	runs int
}

func (c *runCounter) add() {
	c.mu.Lock()
	c.runs++
	c.mu.Unlock()
}

func (c *runCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs
}

// service is a running router with one handler ("consume") on the bundle's
// topic, on a GoChannel whose Publish returns only once the message was
// acked: a Publish that returns is the signal that the message has left the
// consumer for good.
type service struct {
	gc     *gochannel.GoChannel
	pub    message.Publisher // the decorated publisher
	router *message.Router
	logger *testenv.CaptureLogger // the router's
	seen   *outcomes              // outermost
}

// runService starts a router with middlewares added in order (the first is
// the outermost, as Watermill applies them) around handler.
func runService(t *testing.T, b *bundle, middlewares []message.HandlerMiddleware, handler message.NoPublishHandlerFunc) *service {
	t.Helper()
	s := &service{
		gc:     gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{}),
		logger: &testenv.CaptureLogger{},
		seen:   &outcomes{},
	}
	var err error
	s.pub, err = outbox.NewPublisher(b.reg, s.gc)
	require.NoError(t, err)
	s.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: guard}, s.logger)
	require.NoError(t, err)
	s.router.AddMiddleware(s.seen.middleware)
	s.router.AddMiddleware(middlewares...)
	s.router.AddNoPublisherHandler("consume", b.topic, s.gc, handler)
	runErr := make(chan error, 1)
	go func() { runErr <- s.router.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = s.router.Close()
		<-runErr
		_ = s.gc.Close()
	})
	select {
	case <-s.router.Running():
	case err := <-runErr:
		t.Fatalf("router stopped: %v", err)
	}
	return s
}

// publishUntilAcked publishes msg through pub and waits for its ack. It
// fails the test, saying how often the handler ran, if the message is still
// going round after the guard.
func publishUntilAcked(t *testing.T, pub message.Publisher, topic string, msg *message.Message, runs *runCounter) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- pub.Publish(topic, msg) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(guard):
		t.Fatalf("message %s not acked after %v; the handler ran %d times", msg.UUID, guard, runs.count())
	}
}

// status reads the bundle's topic from the store's full status, without
// ages, consumers and the receiver fields: the receiver's check is
// recorded off the handler's path (TestUncheckedRecords tests them).
func (b *bundle) status(t *testing.T) recordstore.TopicStatus {
	t.Helper()
	all, err := b.store.Status(b.ctx(t))
	require.NoError(t, err)
	for _, s := range all {
		if s.Topic == b.topic {
			s.OldestPending = 0
			s.Consumers = nil
			s.Unchecked, s.Seen, s.SinceSeen = 0, false, 0
			return s
		}
	}
	return recordstore.TopicStatus{Topic: b.topic}
}

// errorLines are the Error lines of the given loggers.
func errorLines(loggers ...*testenv.CaptureLogger) []testenv.LogEntry {
	var out []testenv.LogEntry
	for _, l := range loggers {
		out = append(out, l.Entries("error")...)
	}
	return out
}

// TestReplayedMessagesOutliveTheReplay sends the pending records on a
// GoChannel that hands the message's own context to the handler
// (PreserveContext), through each mechanism that sends records again. The
// sender's context ends as soon as it returns; every record must still be
// handled exactly once, with no failed check on the way.
func TestReplayedMessagesOutliveTheReplay(t *testing.T) {
	t.Parallel()
	const records = 3
	senders := []struct {
		name string
		// abandon abandons the records before the service starts.
		abandon bool
		// plugin, when set, is the router plugin that sends the records.
		plugin func(b *bundle, pub message.Publisher, logger watermill.LoggerAdapter) message.RouterPlugin
		// send, when set, sends the records once the router runs; its
		// context is cancelled as soon as it returns.
		send func(ctx context.Context, t *testing.T, b *bundle, pub message.Publisher, ids []int64)
	}{
		{name: "Replay", send: func(ctx context.Context, t *testing.T, b *bundle, pub message.Publisher, _ []int64) {
			res, err := outbox.Replay(ctx, b.reg, pub, outbox.ReplayConfig{PageSize: 2}, b.logger)
			require.NoError(t, err)
			require.Equal(t, records, res.Total())
		}},
		{name: "ReplayPlugin", plugin: func(b *bundle, pub message.Publisher, logger watermill.LoggerAdapter) message.RouterPlugin {
			return outbox.ReplayPlugin(b.reg, pub, outbox.ReplayConfig{PageSize: 2}, logger)
		}},
		{name: "ReplayPluginAfterRunning", plugin: func(b *bundle, pub message.Publisher, logger watermill.LoggerAdapter) message.RouterPlugin {
			return outbox.ReplayPlugin(b.reg, pub, outbox.ReplayConfig{PageSize: 2, AfterRunning: true}, logger)
		}},
		{name: "StaleResubmitter", send: func(ctx context.Context, t *testing.T, b *bundle, pub message.Publisher, _ []int64) {
			b.backdate(t, "created_at", 0)
			b.backdate(t, "last_sent_at", 0)
			r, err := outbox.NewStaleResubmitter(b.reg, pub, outbox.StaleResubmitterConfig{OlderThan: time.Millisecond}, b.logger)
			require.NoError(t, err)
			res, err := r.ResubmitOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, records, res.Total())
		}},
		{name: "Requeue", abandon: true, send: func(ctx context.Context, t *testing.T, b *bundle, pub message.Publisher, ids []int64) {
			for _, id := range ids {
				require.NoError(t, outboxops.Requeue(ctx, b.reg, pub, b.topic, id))
			}
		}},
	}
	for _, s := range senders {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
				b := setup(t, backend, sqlstore.Mark)
				uuids := crashBeforeConsumption(t, b, records)
				recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, records)
				require.NoError(t, err)
				ids := make([]int64, len(recs))
				for i, rec := range recs {
					ids[i] = rec.ID
				}
				if s.abandon {
					abandon(t, b, recs)
				}

				gc := gochannel.NewGoChannel(gochannel.Config{PreserveContext: true}, watermill.NopLogger{})
				t.Cleanup(func() { _ = gc.Close() })
				// The handlers wait until the sender is done, so that no
				// message is handled before the end of the replay could
				// cancel it.
				senderDone := make(chan struct{})
				gate := func(h message.HandlerFunc) message.HandlerFunc {
					return func(msg *message.Message) ([]*message.Message, error) {
						<-senderDone
						return h(msg)
					}
				}
				replayLog := &replayDoneLogger{LoggerAdapter: b.logger, done: senderDone}
				handled := newHandledSet(records)
				seen := &outcomes{}
				routerLog := &testenv.CaptureLogger{}
				router, err := message.NewRouter(message.RouterConfig{CloseTimeout: guard}, routerLog)
				require.NoError(t, err)
				router.AddMiddleware(gate, seen.middleware, b.middleware(t))
				if s.plugin != nil {
					router.AddPlugin(s.plugin(b, gc, replayLog))
				}
				router.AddNoPublisherHandler("consume", b.topic, gc, handled.handle)
				runErr := make(chan error, 1)
				go func() { runErr <- router.Run(context.Background()) }()
				<-router.Running()
				if s.send != nil {
					ctx, cancel := context.WithCancel(b.ctx(t))
					s.send(ctx, t, b, gc, ids)
					cancel() // the sender is done: so is its context
					close(senderDone)
				}

				select {
				case <-handled.done:
				case err := <-runErr:
					t.Fatalf("router stopped: %v", err)
				case <-time.After(guard):
					deliveries, errs := seen.snapshot()
					t.Fatalf("handled %d of %d records after %d deliveries; errors: %v", len(handled.snapshot()), records, deliveries, errs)
				}
				require.NoError(t, router.Close(), "Close waits for the handlers that run")
				require.NoError(t, <-runErr)

				got := handled.snapshot()
				for _, u := range uuids {
					assert.Equal(t, 1, got[u], "record of message %s handled exactly once", u)
				}
				assert.Zero(t, b.pendingCount(t), "every record completed")
				deliveries, errs := seen.snapshot()
				assert.Empty(t, errs, "no delivery failed its check")
				assert.Equal(t, records, deliveries, "one delivery per record")
				for _, e := range append(b.logger.Entries(""), routerLog.Entries("")...) {
					assert.NotContains(t, fmt.Sprint(e.Msg, e.Err), "context canceled")
				}
				assert.Empty(t, errorLines(b.logger, routerLog))
			})
		})
	}
}

// replayDoneLogger closes done when the replay says it replayed its
// records, which it does once it is done with them.
type replayDoneLogger struct {
	watermill.LoggerAdapter
	done chan struct{}
}

func (l *replayDoneLogger) Info(msg string, fields watermill.LogFields) {
	l.LoggerAdapter.Info(msg, fields)
	if msg == "Replayed pending records" {
		close(l.done)
	}
}

// abandon abandons records through a middleware of its own registry, as
// another process would have, so that the service under test has seen no
// consumer yet.
func abandon(t *testing.T, b *bundle, recs []recordstore.Record) {
	t.Helper()
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store})
	require.NoError(t, err)
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{MaxAttempts: 1}, nil)
	require.NoError(t, err)
	for _, rec := range recs {
		msg := b.ownMetadata(t, message.NewMessage(rec.UUID, rec.Payload), strconv.FormatInt(rec.ID, 10))
		_, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("refused") })(msg)
		require.True(t, outbox.IsAbandoned(err), "record %d abandoned: %v", rec.ID, err)
	}
	require.Zero(t, b.pendingCount(t))
}

// proxied opens the backend's database twice: directly, and through a
// fault proxy that the test controls.
func proxied(t *testing.T, backend testenv.Backend) (direct, viaProxy *sqlx.DB, proxy *faultproxy.Proxy) {
	t.Helper()
	direct = backend.Open(t) // skips, or fails under CI=true, when unreachable
	var target, driver string
	var dsn func(addr string) string
	switch backend.Name {
	case "Postgres":
		u, err := url.Parse(testenv.PostgresDSN())
		require.NoError(t, err)
		target, driver = u.Host, "pgx"
		dsn = func(addr string) string { u.Host = addr; return u.String() }
	case "MariaDB":
		cfg, err := mysql.ParseDSN(testenv.MySQLDSN())
		require.NoError(t, err)
		target, driver = cfg.Addr, "mysql"
		dsn = func(addr string) string { cfg.Addr = addr; return cfg.FormatDSN() }
	default:
		t.Fatalf("no proxy for %s", backend.Name)
	}
	proxy, err := faultproxy.New(target)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	viaProxy, err = sqlx.Open(driver, dsn(proxy.Addr()))
	require.NoError(t, err)
	viaProxy.SetMaxOpenConns(4)
	t.Cleanup(func() { _ = viaProxy.Close() })
	return direct, viaProxy, proxy
}

// TestCheckTimeout puts the store's pool behind a proxy that accepts
// connections and never answers: the check before the handler gives up
// after Check.Timeout with a CheckError (nack), and the handler does not
// run. Once the database answers again, the message is handled.
func TestCheckTimeout(t *testing.T) {
	t.Parallel()
	for _, backend := range testenv.Backends() {
		if backend.Name == "SQLite" {
			continue // a file, no connection to silence
		}
		t.Run(backend.Name, func(t *testing.T) {
			t.Parallel()
			for _, identityRead := range []bool{true, false} {
				name := "IdentityAlreadyRead"
				if !identityRead {
					name = "IdentityNotYetRead"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					direct, viaProxy, proxy := proxied(t, backend)
					b := setup(t, backend, sqlstore.Mark)
					b.db = direct
					msg := b.publishTracked(t, 1)[0]
					id := idOf(t, msg)

					// The service's store reads and writes through the proxy.
					store, err := sqlstore.New(sqlstore.Config{Dialect: backend.Dialect, Table: b.store.Table(), Completion: sqlstore.Mark, DB: viaProxy})
					require.NoError(t, err)
					if identityRead {
						_, err := store.Identity(b.ctx(t))
						require.NoError(t, err)
					}
					reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store})
					require.NoError(t, err)
					mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{Timeout: 300 * time.Millisecond}}, b.logger)
					require.NoError(t, err)

					proxy.Silence()
					runs := &runCounter{}
					handle := mw(func(*message.Message) ([]*message.Message, error) { runs.add(); return nil, nil })
					done := make(chan error, 1)
					go func() {
						_, err := handle(msg.Copy())
						done <- err
					}()
					select {
					case err = <-done:
					case <-time.After(guard):
						t.Fatalf("the check before the handler still waits for a silent database after %v", guard)
					}
					var fetchErr *outbox.CheckError
					require.ErrorAs(t, err, &fetchErr, "a check that ran out of time is a nack")
					assert.Equal(t, b.topic, fetchErr.Topic)
					if identityRead {
						assert.Equal(t, id, fetchErr.ID)
					}
					assert.Zero(t, runs.count(), "the handler does not run while the record cannot be checked")

					proxy.Restore()
					patient, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, b.logger)
					require.NoError(t, err)
					_, err = patient(func(*message.Message) ([]*message.Message, error) { runs.add(); return nil, nil })(msg.Copy())
					require.NoError(t, err)
					assert.Equal(t, 1, runs.count(), "the redelivery is handled once the database answers")
					require.NoError(t, reg.WaitCompletions(b.ctx(t)))
					assert.Zero(t, b.pendingCount(t))
				})
			}
		})
	}
}

// TestMalformedIDInARouterRunsOnce delivers, through a router on GoChannel,
// a message of this service's table whose outbox_id is not an id: the
// handler runs once, untracked, one Error line says why, and the message is
// acked. TestMiddlewareOrders checks the same in every middleware order.
func TestMalformedIDInARouterRunsOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		runs := &runCounter{}
		s := runService(t, b, []message.HandlerMiddleware{b.middleware(t)}, func(*message.Message) error { runs.add(); return nil })
		msg := b.ownMetadata(t, message.NewMessage(watermill.NewUUID(), []byte("x")), "abc")
		publishUntilAcked(t, s.gc, b.topic, msg, runs)

		assert.Equal(t, 1, runs.count())
		lines := errorLines(b.logger, s.logger)
		require.Len(t, lines, 1, "one Error line, not one per redelivery")
		assert.ErrorIs(t, lines[0].Err, outbox.ErrInvalidMetadata)
		deliveries, errs := s.seen.snapshot()
		assert.Equal(t, 1, deliveries)
		assert.Empty(t, errs)
	})
}

// TestPanicsCountAsAttempts runs a handler that always panics, with
// Watermill's Recoverer outside the outbox middleware (added first: the
// router applies the first added middleware outermost), inside it, and with
// none (the router recovers on its own): each panic is a failed attempt and
// the third abandons the record.
func TestPanicsCountAsAttempts(t *testing.T) {
	t.Parallel()
	orders := []struct {
		name  string
		chain func(outboxMW message.HandlerMiddleware) []message.HandlerMiddleware
	}{
		{"RecovererOutside", func(mw message.HandlerMiddleware) []message.HandlerMiddleware {
			return []message.HandlerMiddleware{middleware.Recoverer, mw}
		}},
		{"RecovererInside", func(mw message.HandlerMiddleware) []message.HandlerMiddleware {
			return []message.HandlerMiddleware{mw, middleware.Recoverer}
		}},
		{"NoRecoverer", func(mw message.HandlerMiddleware) []message.HandlerMiddleware {
			return []message.HandlerMiddleware{mw}
		}},
	}
	for _, o := range orders {
		t.Run(o.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
				b := setup(t, backend, sqlstore.Mark)
				mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{MaxAttempts: 3, Backoff: outbox.Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond}}, b.logger)
				require.NoError(t, err)
				runs := &runCounter{}
				s := runService(t, b, o.chain(mw), func(*message.Message) error {
					runs.add()
					panic("handler bug")
				})
				msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
				publishUntilAcked(t, s.pub, b.topic, msg, runs)

				assert.Equal(t, 3, runs.count(), "MaxAttempts runs, then abandoned")
				assert.Equal(t, recordstore.TopicStatus{Topic: b.topic, Abandoned: 1}, b.status(t))
				attempts, lastErr := b.attemptsOf(t, idOf(t, msg))
				assert.Equal(t, 3, attempts)
				assert.Contains(t, lastErr, "handler bug")
			})
		})
	}
}

// TestBackoff spaces the attempts of a failing handler: the delivery is due
// again only after a delay kept with the record, and a copy that comes
// earlier is held and nacked without running the handler.
func TestBackoff(t *testing.T) {
	t.Parallel()
	boom := errors.New("downstream refused")
	hour := outbox.Backoff{Initial: time.Hour, Max: 2 * time.Hour}

	// heldCopy delivers a copy of msg through mw with a message context
	// that ends soon, and checks that it was held and nacked unrun, and
	// that store has it due after the first delay.
	heldCopy := func(t *testing.T, mw message.HandlerMiddleware, store recordstore.Store, msg *message.Message, runs *runCounter) {
		t.Helper()
		cp := msg.Copy()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		cp.SetContext(ctx)
		before := runs.count()
		_, err := mw(func(*message.Message) ([]*message.Message, error) { runs.add(); return nil, boom })(cp)
		require.NoError(t, err, "a hold is routine: the middleware nacks the copy itself, so that no router logs it as an error")
		assert.True(t, nacked(cp), "an early copy is nacked")
		assert.Equal(t, before, runs.count(), "and not handled")
		var notDue *recordstore.NotDueError
		require.ErrorAs(t, store.CheckPending(context.Background(), recordstore.Delivery{ID: idOf(t, msg), Topic: msg.Metadata.Get(outbox.MetadataTopic)}), &notDue)
		assert.Greater(t, notDue.Wait, 30*time.Minute, "due after the first delay, give or take its jitter")
		assert.LessOrEqual(t, notDue.Wait, 72*time.Minute)
	}

	t.Run("FailingHandlerOnGoChannelRunsMaxAttemptsTimes", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{MaxAttempts: 4, Backoff: outbox.Backoff{Initial: 250 * time.Millisecond, Max: 500 * time.Millisecond}}, b.logger)
			require.NoError(t, err)
			runs := &runCounter{}
			s := runService(t, b, []message.HandlerMiddleware{mw}, func(*message.Message) error { runs.add(); return boom })
			publishUntilAcked(t, s.pub, b.topic, message.NewMessage(watermill.NewUUID(), nil), runs)

			assert.Equal(t, 4, runs.count())
			assert.Equal(t, recordstore.TopicStatus{Topic: b.topic, Abandoned: 1}, b.status(t))
			deliveries, errs := s.seen.snapshot()
			notDue := deliveries - len(errs) - 1 // the rest were held, nacked with no error; one was acked
			t.Logf("handler runs %d, deliveries %d, held not due %d", runs.count(), deliveries, notDue)
			assert.GreaterOrEqual(t, notDue, 3, "a copy came back before each retry was due and was held")
			assert.LessOrEqual(t, deliveries, 20, "GoChannel redelivers at once; the holds keep it from spinning")
		})
	})

	t.Run("EarlyCopyIsHeldNotRun", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{Backoff: hour}, b.logger)
			require.NoError(t, err)
			runs := &runCounter{}
			_, err = mw(func(*message.Message) ([]*message.Message, error) { runs.add(); return nil, boom })(msg.Copy())
			require.ErrorIs(t, err, boom)
			heldCopy(t, mw, b.store, msg, runs)
			assert.ErrorIs(t, b.store.CheckPending(b.ctx(t), b.delivery(idOf(t, msg))), recordstore.ErrNotDue, "the due time is the record's")
		})
	})

	t.Run("DueTimeSurvivesRestart", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msg := b.publishTracked(t, 1)[0]
			mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{Backoff: hour}, b.logger)
			require.NoError(t, err)
			runs := &runCounter{}
			_, err = mw(func(*message.Message) ([]*message.Message, error) { runs.add(); return nil, boom })(msg.Copy())
			require.ErrorIs(t, err, boom)

			// A new process: new store value, registry and middleware, with
			// no backoff of its own; the due time is the database's.
			store, err := sqlstore.New(sqlstore.Config{Dialect: backend.Dialect, Table: b.store.Table(), Completion: sqlstore.Mark, DB: b.db})
			require.NoError(t, err)
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store})
			require.NoError(t, err)
			restarted, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Backoff: outbox.Backoff{Disabled: true}}, b.logger)
			require.NoError(t, err)
			heldCopy(t, restarted, store, msg, runs)
			assert.Equal(t, 1, runs.count())
		})
	})

	t.Run("StaleResubmitterSkipsRecordsNotDue", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msgs := b.publishTracked(t, 2)
			failed, lost := msgs[0], msgs[1]
			mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{Backoff: hour}, b.logger)
			require.NoError(t, err)
			_, err = mw(func(*message.Message) ([]*message.Message, error) { return nil, boom })(failed.Copy())
			require.ErrorIs(t, err, boom)
			b.backdate(t, "created_at", 0)
			b.backdate(t, "last_sent_at", 0)

			rec := &recordingPublisher{Publisher: discardPublisher{}}
			r, err := outbox.NewStaleResubmitter(b.reg, rec, outbox.StaleResubmitterConfig{OlderThan: time.Millisecond}, b.logger)
			require.NoError(t, err)
			sent, err := r.ResubmitOnce(b.ctx(t))
			require.NoError(t, err)
			assert.Equal(t, 1, sent.Total(), "only the record that is due")
			require.Len(t, rec.msgs, 1)
			assert.Equal(t, lost.UUID, rec.msgs[0].UUID)
		})
	})

	t.Run("ConfigurationIsChecked", func(t *testing.T) {
		t.Parallel()
		reg, err := outbox.NewRegistry()
		require.NoError(t, err)
		for _, bad := range []outbox.Backoff{
			{Initial: -time.Second},
			{Initial: time.Minute, Max: time.Second},
			{Multiplier: 0.5},
			{Jitter: 1},
		} {
			_, err = outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Backoff: bad}, nil)
			assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "%+v", bad)
		}
		_, err = outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{Timeout: -time.Second}}, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
	})
}

// TestRepublishedMessageSavesCleanKeys publishes a message whose send
// failed again, the same *message.Message, as a caller retrying would: the
// second record keeps none of the first one's outbox keys, and the message
// sent carries the second record's id.
func TestRepublishedMessageSavesCleanKeys(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		down, err := outbox.NewPublisher(b.reg, failingPublisher{})
		require.NoError(t, err)
		msg := message.NewMessage(watermill.NewUUID(), []byte("retry me"))
		msg.Metadata.Set("traceparent", traceparent)
		var sendErr *outbox.SendError
		require.ErrorAs(t, down.Publish(b.topic, msg), &sendErr)
		require.Len(t, sendErr.IDs, 1)
		firstID := sendErr.IDs[0]
		require.Equal(t, firstID, idOf(t, msg), "the failed send stamped the first record's id")

		gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
		t.Cleanup(func() { _ = gc.Close() })
		sub, err := gc.Subscribe(b.ctx(t), b.topic)
		require.NoError(t, err)
		up, err := outbox.NewPublisher(b.reg, gc)
		require.NoError(t, err)
		require.NoError(t, up.Publish(b.topic, msg))

		recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, 10)
		require.NoError(t, err)
		require.Len(t, recs, 2)
		for _, rec := range recs {
			for k := range rec.Metadata {
				assert.False(t, strings.HasPrefix(k, "outbox_"), "record %d saved outbox key %q", rec.ID, k)
			}
			assert.Equal(t, traceparent, rec.Metadata["traceparent"], "the message's own metadata is kept")
		}
		secondID := recs[1].ID
		assert.NotEqual(t, firstID, secondID)

		select {
		case got := <-sub:
			got.Ack()
			assert.Equal(t, secondID, idOf(t, got), "the message carries the new record's id")
		case <-b.ctx(t).Done():
			t.Fatal("the republished message was not sent")
		}
	})
}

// TestToggleOffSaysSoOnce builds a registry in a test binary without the
// toggle, as a user's own go test does: the first middleware built on it
// says once, at Info, that tracking is off and how to turn it on. Not
// parallel: it changes the environment.
func TestToggleOffSaysSoOnce(t *testing.T) {
	t.Setenv(outbox.EnvToggle, "")
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: plainStore{}})
	require.NoError(t, err)
	require.False(t, reg.Enabled())

	logger := &testenv.CaptureLogger{}
	_, err = outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, logger)
	require.NoError(t, err)
	lines := logger.Entries("")
	require.Len(t, lines, 1)
	assert.Equal(t, "info", lines[0].Level)
	assert.Contains(t, lines[0].Msg, outbox.EnvToggle+"=on", "it says how to turn tracking on")

	_, err = outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, logger)
	require.NoError(t, err)
	_, err = outbox.Replay(context.Background(), reg, discardPublisher{}, outbox.ReplayConfig{}, logger)
	require.NoError(t, err)
	assert.Len(t, logger.Entries(""), 1, "once per registry")

	t.Setenv(outbox.EnvToggle, "on")
	on, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: plainStore{}})
	require.NoError(t, err)
	quiet := &testenv.CaptureLogger{}
	_, err = outbox.NewMiddleware(on, outbox.MiddlewareConfig{}, quiet)
	require.NoError(t, err)
	assert.Empty(t, quiet.Entries(""), "nothing to say when tracking is on")
}

// TestFirstDeliveriesAtOnceAreAllTracked delivers the first messages of a
// topic without declared consumers to one handler all at once, as a replay
// does: the handler is the topic's first receiver for each of them, so none
// runs untracked, none is reported as a second receiver, and every record
// completes.
func TestFirstDeliveriesAtOnceAreAllTracked(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		const rounds, width = 10, 8
		for round := range rounds {
			// A new process each round: a registry that has seen no
			// receiver yet.
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store})
			require.NoError(t, err)
			mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, b.logger)
			require.NoError(t, err)
			// The deliveries wait for each other, then go in together.
			var arrived sync.WaitGroup
			arrived.Add(width)
			together := func(h message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					arrived.Done()
					arrived.Wait()
					return h(msg)
				}
			}
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			handled := newHandledSet(width)
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: guard}, watermill.NopLogger{})
			require.NoError(t, err)
			router.AddMiddleware(together, mw)
			router.AddNoPublisherHandler("consume", b.topic, gc, handled.handle)
			runErr := make(chan error, 1)
			go func() { runErr <- router.Run(context.Background()) }()
			<-router.Running()
			pub, err := outbox.NewPublisher(reg, gc)
			require.NoError(t, err)
			for i := range width {
				require.NoError(t, pub.Publish(b.topic, message.NewMessage(fmt.Sprintf("r%d-%d", round, i), nil)))
			}
			select {
			case <-handled.done:
			case <-time.After(guard):
				t.Fatalf("round %d: handled %d of %d", round, len(handled.snapshot()), width)
			}
			require.NoError(t, router.Close())
			require.NoError(t, <-runErr)
			require.NoError(t, reg.WaitCompletions(b.ctx(t)))
			require.NoError(t, gc.Close())
		}
		assert.Empty(t, errorLines(b.logger), "one handler is never its own second receiver")
		assert.Zero(t, b.pendingCount(t), "every record was handled tracked and completed")
	})
}
