package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

// Bytes some database refuses: PostgreSQL's text keeps no NUL byte and no
// invalid UTF-8, MySQL's utf8mb4 no invalid UTF-8.
const (
	withNUL = "order\x00"
	notUTF8 = "order\xff"
)

// bytesService is one service's router on a GoChannel whose Publish returns
// once the message was acked. Its outermost middleware records what each
// delivery returned and acks it: an error there is what would have nacked
// the message, and brought it back for ever.
type bytesService struct {
	gc     *gochannel.GoChannel
	reg    *outbox.Registry
	router *message.Router
	mu     sync.Mutex
	errs   []error
	runs   map[string]int // handler + " " + message UUID
}

// namedHandler is a handler of a bytesService: its name, its topic, and
// what it does once counted (nil: succeeds).
type namedHandler struct {
	name, topic string
	fn          func(msg *message.Message) error
}

func startBytesService(t testing.TB, reg *outbox.Registry, cfg outbox.MiddlewareConfig, logger watermill.LoggerAdapter,
	handlers ...namedHandler) *bytesService {
	t.Helper()
	s := &bytesService{gc: gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{}), reg: reg, runs: map[string]int{}}
	var err error
	s.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: guard}, watermill.NopLogger{})
	require.NoError(t, err)
	if cfg.Backoff == (outbox.Backoff{}) {
		cfg.Backoff = redeliverAtOnce
	}
	mw, err := outbox.NewMiddleware(reg, cfg, logger)
	require.NoError(t, err)
	s.router.AddMiddleware(s.ack, mw)
	for _, h := range handlers {
		s.router.AddNoPublisherHandler(h.name, h.topic, s.gc, func(msg *message.Message) error {
			s.mu.Lock()
			s.runs[h.name+" "+msg.UUID]++
			s.mu.Unlock()
			if h.fn != nil {
				return h.fn(msg)
			}
			return nil
		})
	}
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

func (s *bytesService) ack(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			s.mu.Lock()
			s.errs = append(s.errs, err)
			s.mu.Unlock()
		}
		return out, nil
	}
}

// deliver sends a copy of msg on the topic and waits until it is acked.
func (s *bytesService) deliver(t testing.TB, topic string, msg *message.Message) {
	t.Helper()
	sendUntilAcked(t, s.gc, topic, msg.Copy())
	s.settled(t)
}

// settled waits until the completions of the acked messages ran.
func (s *bytesService) settled(t testing.TB) {
	t.Helper()
	require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), s.reg))
}

// sendUntilAcked publishes msg through pub, onto a bytesService's
// GoChannel, and waits until it is acked.
func sendUntilAcked(t testing.TB, pub message.Publisher, topic string, msg *message.Message) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- pub.Publish(topic, msg) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(guard):
		t.Fatalf("message %q not acked after %v", msg.UUID, guard)
	}
}

// take returns, and forgets, what the deliveries returned so far.
func (s *bytesService) take() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := s.errs
	s.errs = nil
	return errs
}

func (s *bytesService) ran(handler, uuid string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[handler+" "+uuid]
}

// leasedStore is a store with a delivery lease on a fresh table: its check
// sends the message's UUID to the database, in the claim.
func leasedStore(tb testing.TB, b testenv.Backend, db *sqlx.DB) *sqlstore.Store {
	tb.Helper()
	table := testenv.Table(tb)
	store, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, DB: db, Table: table, Lease: time.Minute})
	require.NoError(tb, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(tb, store.Migrate(ctx))
	tb.Cleanup(func() { testenv.DropTable(tb, db, b.Dialect, table) })
	return store
}

// ordersOnALeasedStore is a registry tracking "orders" in a leased store of
// its own, observed by the tally it returns.
func ordersOnALeasedStore(t *testing.T, b testenv.Backend) (*sqlstore.Store, *outbox.Registry, *tally) {
	t.Helper()
	store := leasedStore(t, b, b.Open(t))
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	require.NoError(t, err)
	obs := newTally()
	reg.SetObserver(obs)
	return store, reg, obs
}

// inboxOnAFreshTable is an inbox on a fresh table of the backend, migrated
// and dropped when the test ends.
func inboxOnAFreshTable(tb testing.TB, b testenv.Backend, db *sqlx.DB) *sqlstore.Inbox {
	tb.Helper()
	inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db, Table: "inbox_" + testenv.Table(tb)[2:]})
	require.NoError(tb, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(tb, inbox.Migrate(ctx))
	tb.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE "+inbox.Table()) })
	return inbox
}

// TestValuesTheTableCannotKeep: one service, one router on GoChannel, its
// tracked topic in its own table (with a delivery lease, whose claim sends
// the message's UUID). A message whose UUID, or whose handler's name, the
// table cannot keep is never handled as a database outage: it is acked
// without running the handler, logged and counted as a mismatch, and the
// record waits for its own message. A failure whose text the table cannot
// keep is counted, so that MaxAttempts abandons.
func TestValuesTheTableCannotKeep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		t.Run("CopiesWithSuchAUUIDAreMismatches", func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			store, reg, obs := ordersOnALeasedStore(t, b)
			logger := &testenv.CaptureLogger{}
			s := startBytesService(t, reg, outbox.MiddlewareConfig{}, logger, namedHandler{name: "billing", topic: "orders"})
			pub, err := outbox.NewPublisher(reg, failingPublisher{})
			require.NoError(t, err)
			sent := message.NewMessage("order-1", []byte("{}"))
			require.Error(t, pub.Publish("orders", sent), "the send fails: the record stays pending")

			for _, uuid := range []string{withNUL, notUTF8} {
				forged := message.NewMessage(uuid, []byte("{}"))
				for _, k := range []string{outbox.MetadataID, outbox.MetadataTopic, outbox.MetadataTable} {
					forged.Metadata.Set(k, sent.Metadata.Get(k))
				}
				s.deliver(t, "orders", forged)
				assert.Empty(t, s.take(), "message %q: nothing to nack", uuid)
				assert.Zero(t, s.ran("billing", uuid), "message %q: not the record's message, not handled", uuid)
			}
			assert.Equal(t, 2, obs.get("mismatched"))
			assert.Len(t, logger.Entries("error"), 2, "each logged")

			_, err = outbox.Replay(ctx, reg, s.gc, outbox.ReplayConfig{}, nil)
			require.NoError(t, err)
			s.settled(t)
			assert.Equal(t, 1, s.ran("billing", "order-1"), "the record's own message is handled")
			pending, err := store.PendingAfter(ctx, "orders", 0, 10)
			require.NoError(t, err)
			assert.Empty(t, pending)
		})

		t.Run("AHandlerNameTheTableCannotKeep", func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			store, reg, obs := ordersOnALeasedStore(t, b)
			logger := &testenv.CaptureLogger{}
			// PostgreSQL keeps no NUL byte; MySQL/MariaDB no consumer of
			// more than 512 bytes; SQLite keeps both.
			name := "billing\x00" + strings.Repeat("x", 512)
			s := startBytesService(t, reg, outbox.MiddlewareConfig{}, logger, namedHandler{name: name, topic: "orders"})
			pub, err := outbox.NewPublisher(reg, s.gc)
			require.NoError(t, err)
			sendUntilAcked(t, pub, "orders", message.NewMessage("order-1", []byte("{}")))
			s.settled(t)
			assert.Empty(t, s.take(), "nothing to nack")
			pending, err := store.PendingAfter(ctx, "orders", 0, 10)
			require.NoError(t, err)
			if b.Name == "SQLite" {
				assert.Equal(t, 1, s.ran(name, "order-1"))
				assert.Empty(t, pending, "SQLite keeps the name: tracked and completed")
				return
			}
			assert.Zero(t, s.ran(name, "order-1"), "a consumer the table cannot keep is not tracked, and not handled untracked")
			assert.Len(t, pending, 1, "the record stays pending")
			assert.Equal(t, 1, obs.get("mismatched"))
			errs := logger.Entries("error")
			require.Len(t, errs, 1)
			assert.ErrorIs(t, errs[0].Err, recordstore.ErrInvalidValue)
		})

		t.Run("AFailureWithSuchATextIsCounted", func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			store, reg, _ := ordersOnALeasedStore(t, b)
			boom := errors.New("boom " + withNUL + " " + notUTF8)
			s := startBytesService(t, reg, outbox.MiddlewareConfig{MaxAttempts: 2}, nil,
				namedHandler{name: "billing", topic: "orders", fn: func(*message.Message) error { return boom }})
			pub, err := outbox.NewPublisher(reg, failingPublisher{})
			require.NoError(t, err)
			msg := message.NewMessage("order-1", []byte("{}"))
			require.Error(t, pub.Publish("orders", msg))

			s.deliver(t, "orders", msg)
			errs := s.take()
			require.Len(t, errs, 1)
			assert.Same(t, boom, errs[0], "the first failure is counted and nacked")
			s.deliver(t, "orders", msg)
			errs = s.take()
			require.Len(t, errs, 1)
			assert.True(t, outbox.IsAbandoned(errs[0]), "the second failure of two abandons: %v", errs[0])
			s.deliver(t, "orders", msg)
			assert.Empty(t, s.take())
			assert.Equal(t, 2, s.ran("billing", "order-1"), "an abandoned record's copy is not handled")
			pending, err := store.PendingAfter(ctx, "orders", 0, 10)
			require.NoError(t, err)
			assert.Empty(t, pending)
		})
	})
}

// TestAnotherServicesMessageWithBytesTheInboxCannotKeep: one receiving
// service, one router on GoChannel, its handlers keeping another service's
// messages in an inbox (one through outbox.InboxTx, in its transaction),
// with a business key. A message whose UUID, business key or table identity
// the inbox cannot keep, each copy delivered twice, is never nacked: it is
// handled, once when the inbox keeps it, and otherwise on each copy, without
// deduplication and with the reason logged.
func TestAnotherServicesMessageWithBytesTheInboxCannotKeep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		db := b.Open(t)
		inbox := inboxOnAFreshTable(t, b, db)
		reg, err := outbox.NewRegistry()
		require.NoError(t, err)
		logger := &testenv.CaptureLogger{}
		inTx := func(msg *message.Message) error {
			tx, err := db.BeginTxx(msg.Context(), nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
			if err := outbox.InboxTx(msg.Context(), tx, msg); err != nil {
				return err
			}
			return tx.Commit()
		}
		s := startBytesService(t, reg, outbox.MiddlewareConfig{Inbox: inbox, BusinessKey: func(msg *message.Message) string { return msg.Metadata.Get("order") }},
			logger, namedHandler{name: "billing", topic: "orders"}, namedHandler{name: "shipping", topic: "orders", fn: inTx})

		n := 0
		for _, field := range []string{"uuid", "business key", "table identity"} {
			for _, bad := range []string{withNUL, notUTF8} {
				n++
				uuid, key, source := fmt.Sprintf("order-%d", n), fmt.Sprintf("key-%d", n), "0123456789abcdef0123456789abcdef"
				*map[string]*string{"uuid": &uuid, "business key": &key, "table identity": &source}[field] += bad
				msg := message.NewMessage(uuid, []byte("{}"))
				msg.Metadata.Set(outbox.MetadataID, "7")
				msg.Metadata.Set(outbox.MetadataTopic, "orders")
				msg.Metadata.Set(outbox.MetadataTable, source)
				msg.Metadata.Set("order", key)
				before := len(logger.Entries("error"))
				s.deliver(t, "orders", msg)
				s.deliver(t, "orders", msg)
				assert.Empty(t, s.take(), "%s %q: nothing to nack", field, bad)
				refusals := logger.Entries("error")[before:]
				for _, consumer := range []string{"billing", "shipping"} {
					runs := s.ran(consumer, uuid)
					switch {
					case runs == 1:
						assert.NotEqual(t, "Postgres", b.Name, "%s %q: PostgreSQL cannot keep it", field, bad)
					case assert.Equal(t, 2, runs, "%s %q for %s: handled once per copy", field, bad, consumer):
						assert.NotEmpty(t, refusals, "%s %q: the reason is logged", field, bad)
					}
				}
				for _, e := range refusals {
					assert.ErrorIs(t, e.Err, recordstore.ErrInvalidEntry, "%s %q", field, bad)
				}
			}
		}
	})
}

// TestConfirmationsWithValuesTheTableCannotKeep: a sending service whose
// table has a delivery lease receives confirmations of its pending records
// that name a message UUID the table cannot keep (JSON carries a NUL byte as
// \u0000), and a confirmation of a declared remote consumer whose name the
// table cannot keep, of a record saved before it was declared. None is
// nacked: the first are rejected and counted; the last completes its
// delivery where the table keeps the name (SQLite, MariaDB) and is rejected
// where it does not (PostgreSQL).
func TestConfirmationsWithValuesTheTableCannotKeep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		store := leasedStore(t, b, b.Open(t))
		const unkept = "billing\x00"
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store, RemoteConsumers: []string{"billing", unkept}})
		require.NoError(t, err)
		obs := &confirmTally{tally: newTally(), handled: make(chan struct{}, 1)}
		reg.SetObserver(obs)
		identity, err := store.Identity(ctx)
		require.NoError(t, err)
		// Saved before the topic declared its remote consumers.
		rec := []recordstore.Record{{Topic: "orders", UUID: "order-1", Payload: []byte("{}")}}
		require.NoError(t, store.Insert(ctx, rec))
		confirm, err := outbox.NewConfirmationHandler(reg, outbox.ConfirmationHandlerConfig{}, nil)
		require.NoError(t, err)
		payload := func(uuid, consumer string) []byte {
			return fmt.Appendf(nil, `{"store":%q,"topic":"orders","id":%d,"uuid":"%s","consumer":"%s"}`, identity, rec[0].ID, uuid, consumer)
		}
		for _, uuid := range []string{`order-1\u0000`, `\u0000`} {
			assert.NoError(t, confirm(message.NewMessage(watermill.NewUUID(), payload(uuid, "billing"))), "uuid %s", uuid)
		}
		assert.Equal(t, int64(2), obs.rejected.Load())
		assert.NoError(t, confirm(message.NewMessage(watermill.NewUUID(), payload("order-1", `billing\u0000`))), "a consumer the table cannot keep")
		pending, err := store.PendingAfter(ctx, "orders", 0, 10)
		require.NoError(t, err)
		assert.Len(t, pending, 1, "billing has not confirmed")
		if b.Name == "Postgres" {
			assert.Equal(t, int64(3), obs.rejected.Load(), "PostgreSQL keeps no NUL byte: rejected")
			assert.Zero(t, obs.get("handled"))
			return
		}
		assert.Equal(t, 1, obs.get("handled"), "%s keeps the name: its delivery completes", b.Name)
	})
}

// TestFailureReportWithATextTheTableCannotKeep: a sending service whose
// remote consumer reports a failed handling (its confirmation with
// "failed") quoting bytes the table cannot keep counts the attempt, and
// the report is acked, never nacked for ever.
func TestFailureReportWithATextTheTableCannotKeep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		store := leasedStore(t, b, b.Open(t))
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "refunds", Store: store, RemoteConsumers: []string{"billing"}})
		require.NoError(t, err)
		obs := &confirmTally{tally: newTally(), handled: make(chan struct{}, 1)}
		reg.SetObserver(obs)
		identity, err := store.Identity(ctx)
		require.NoError(t, err)
		rec := []recordstore.Record{{Topic: "refunds", UUID: "refund-1", Payload: []byte("{}"), Consumers: []string{"billing"}}}
		require.NoError(t, store.Insert(ctx, rec))
		confirm, err := outbox.NewConfirmationHandler(reg, outbox.ConfirmationHandlerConfig{}, nil)
		require.NoError(t, err)
		report := fmt.Appendf(nil, `{"store":%q,"topic":"refunds","id":%d,"uuid":"refund-1","consumer":"billing","failed":"boom \u0000 boom"}`, identity, rec[0].ID)
		require.NoError(t, confirm(message.NewMessage(watermill.NewUUID(), report)))
		assert.Equal(t, 1, obs.get("failed"), "the failure is counted")
		assert.Zero(t, obs.rejected.Load())
		var attempts int
		db := store.DB()
		require.NoError(t, db.GetContext(ctx, &attempts, db.Rebind("SELECT attempts FROM "+store.Table()+"_consumers WHERE record_id = ?"), rec[0].ID))
		assert.Equal(t, 1, attempts, "and kept")
	})
}

// FuzzBytesThePostgresDatabaseRefuses feeds arbitrary message UUIDs,
// business keys and table identities to one receiving service on a real
// PostgreSQL database, one router on GoChannel: its handler "billing"
// receives another service's messages, kept in a PostgreSQL inbox with a
// business key, and its handler "orders" this service's own, whose table
// has a delivery lease. Each message is delivered twice. Whatever the
// bytes, no delivery returns an error (that is, is nacked, to come back
// for ever): another service's message is handled once, or once per copy
// when the inbox cannot keep it; a message naming this service's pending
// record is handled, and completes it, only when its UUID is the record's.
// The seed corpus runs with the other tests.
func FuzzBytesThePostgresDatabaseRefuses(f *testing.F) {
	b := testenv.Backends()[0]
	db := b.Open(f)
	ctx := f.Context()
	inbox := inboxOnAFreshTable(f, b, db)
	store := leasedStore(f, b, db)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	require.NoError(f, err)
	identity, err := store.Identity(ctx)
	require.NoError(f, err)
	s := startBytesService(f, reg, outbox.MiddlewareConfig{Inbox: inbox, BusinessKey: func(msg *message.Message) string { return msg.Metadata.Get("order") }},
		nil, namedHandler{name: "billing", topic: "payments"}, namedHandler{name: "orders", topic: "orders"})

	for _, seed := range []struct{ uuid, key, source string }{
		{"order-1", "", "0123456789abcdef0123456789abcdef"}, {"order-1", "key-1", ""}, {"", "", ""},
		{"\x00", "\x00", "\x00"}, {"a\x00b", "k", "s"}, {"u", "a\x00b", "s"}, {"u", "k", "a\x00b"},
		{"\xff", "\xfe", "\xc3\x28"}, {"a\xffb", "k", "s"}, {"u", "a\xffb", "s"}, {"u", "k", "a\xffb"},
		{"\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf"}, {"€", "€", "€"}, {strings.Repeat("u", 300), "k", "s"},
	} {
		f.Add(seed.uuid, seed.key, seed.source, false)
		f.Add(seed.uuid, seed.key, seed.source, true)
	}
	n := 0
	f.Fuzz(func(t *testing.T, uuid, key, source string, own bool) {
		n++
		msg := message.NewMessage(uuid, []byte("{}"))
		if !own {
			msg.Metadata.Set(outbox.MetadataID, "7")
			msg.Metadata.Set(outbox.MetadataTopic, "payments")
			msg.Metadata.Set(outbox.MetadataTable, source)
			msg.Metadata.Set("order", key)
			// Each input its own messages, so that only its own copies
			// are duplicates.
			msg.UUID = fmt.Sprintf("%d:%s", n, uuid)
			if key != "" {
				msg.Metadata.Set("order", fmt.Sprintf("%d:%s", n, key))
			}
			before := s.ran("billing", msg.UUID)
			s.deliver(t, "payments", msg)
			s.deliver(t, "payments", msg)
			if errs := s.take(); len(errs) > 0 {
				t.Fatalf("uuid %q, key %q, source %q: a delivery returned %v", uuid, key, source, errs)
			}
			if runs := s.ran("billing", msg.UUID) - before; runs != 1 && runs != 2 {
				t.Fatalf("uuid %q, key %q, source %q: handled %d times for two copies", uuid, key, source, runs)
			}
			return
		}
		recs := []recordstore.Record{{Topic: "orders", UUID: fmt.Sprintf("record-%d", n), Payload: []byte("{}")}}
		require.NoError(t, store.Insert(ctx, recs))
		msg.Metadata.Set(outbox.MetadataID, fmt.Sprint(recs[0].ID))
		msg.Metadata.Set(outbox.MetadataTopic, "orders")
		msg.Metadata.Set(outbox.MetadataTable, identity)
		s.deliver(t, "orders", msg)
		s.deliver(t, "orders", msg)
		if errs := s.take(); len(errs) > 0 {
			t.Fatalf("uuid %q naming record %d: a delivery returned %v", uuid, recs[0].ID, errs)
		}
		if runs := s.ran("orders", uuid); runs != 0 {
			t.Fatalf("uuid %q, not the record's, handled %d times", uuid, runs)
		}
		real := msg.Copy()
		real.UUID = recs[0].UUID
		s.deliver(t, "orders", real)
		if errs := s.take(); len(errs) > 0 || s.ran("orders", real.UUID) != 1 {
			t.Fatalf("the record's own message after %q: %v, handled %d times", uuid, errs, s.ran("orders", real.UUID))
		}
		if err := store.CheckPending(ctx, recordstore.Delivery{ID: recs[0].ID, Topic: "orders"}); !errors.Is(err, recordstore.ErrNotPending) {
			t.Fatalf("record %d after its own message: %v", recs[0].ID, err)
		}
	})
}
