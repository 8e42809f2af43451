package outbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/faultproxy"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// checksPerSecondBound is the bound MiddlewareConfig.Check.RetryDelay states
// with its default: a message is checked at most once per 50 ms while its
// checks fail.
const checksPerSecondBound = 20

// TestRefusedChecksBackOff runs a router on GoChannel with three tracked
// messages in flight while a fault proxy in front of PostgreSQL (and
// MariaDB) refuses every connection: each failed check holds its message,
// for a delay that doubles with each consecutive failure, before the nack,
// so the outage costs a bounded number of checks and error lines per
// message per second. Once the proxy heals every message is handled once.
func TestRefusedChecksBackOff(t *testing.T) {
	t.Parallel()
	const inFlight = 3
	const outage = 3 * time.Second
	for _, backend := range testenv.Backends() {
		if backend.Name == "SQLite" {
			continue // a file, no connection to refuse
		}
		t.Run(backend.Name, func(t *testing.T) {
			t.Parallel()
			b, proxy, msgs := proxiedBundle(t, backend, inFlight)
			mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{}, b.logger)
			require.NoError(t, err)
			handled := newHandledSet(inFlight)
			s := runService(t, b, []message.HandlerMiddleware{mw}, handled.handle)

			proxy.Cut()
			acked := make(chan error, inFlight)
			for _, msg := range msgs {
				go func() { acked <- s.gc.Publish(b.topic, msg.Copy()) }()
			}
			time.Sleep(outage) // the outage is a span of time: nothing to wait for
			checks, _ := s.seen.snapshot()
			lines := len(errorLines(s.logger))
			proxy.Restore()

			perMessage := float64(checks) / inFlight / outage.Seconds()
			t.Logf("%s refused for %v: %d checks, %d router error lines for %d messages in flight: %.1f checks per message per second",
				backend.Name, outage, checks, lines, inFlight, perMessage)
			assert.Less(t, perMessage, float64(checksPerSecondBound), "checks per message per second during the outage")
			assert.Less(t, float64(lines)/inFlight/outage.Seconds(), float64(checksPerSecondBound), "router error lines per message per second")

			for range msgs {
				select {
				case err := <-acked:
					require.NoError(t, err)
				case <-time.After(guard):
					t.Fatalf("messages not all acked %v after the database came back; handled %v", guard, handled.snapshot())
				}
			}
			for _, msg := range msgs {
				assert.Equal(t, 1, handled.snapshot()[msg.UUID], "message %s handled once", msg.UUID)
			}
			require.NoError(t, b.reg.WaitCompletions(b.ctx(t)))
			assert.Zero(t, b.pendingCount(t), "every record completed")
		})
	}
}

// proxiedBundle sets up a bundle with n tracked messages whose records are
// pending, and a registry whose store reads and writes through a fault
// proxy; the store's table identity is read while the database answers.
func proxiedBundle(t *testing.T, backend testenv.Backend, n int) (*bundle, *faultproxy.Proxy, []*message.Message) {
	t.Helper()
	direct, viaProxy, proxy := proxied(t, backend)
	b := setup(t, backend, sqlstore.Mark)
	b.db = direct
	msgs := b.publishTracked(t, n)
	store, err := sqlstore.New(sqlstore.Config{Dialect: backend.Dialect, Table: b.store.Table(), Completion: sqlstore.Mark, DB: viaProxy})
	require.NoError(t, err)
	_, err = store.Identity(b.ctx(t))
	require.NoError(t, err)
	b.reg, err = outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store})
	require.NoError(t, err)
	return b, proxy, msgs
}

// failingInbox is an inbox whose database is gone: every read fails at
// once.
type failingInbox struct {
	recordstore.Inbox
	reads atomic.Int64
}

func (f *failingInbox) Handled(context.Context, recordstore.InboxEntry) (bool, error) {
	f.reads.Add(1)
	return false, errors.New("connect: connection refused")
}

// TestRefusedInboxChecksBackOff delivers another service's tracked message,
// on GoChannel through a router, to a consumer whose inbox cannot be read:
// the inbox check is spaced as the record check is.
func TestRefusedInboxChecksBackOff(t *testing.T) {
	t.Parallel()
	const window = 2 * time.Second
	b := setup(t, testenv.Backends()[1], sqlstore.Mark)
	inbox := &failingInbox{}
	mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{Inbox: inbox}, b.logger)
	require.NoError(t, err)
	s := runService(t, b, []message.HandlerMiddleware{mw}, func(*message.Message) error { return nil })

	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set(outbox.MetadataID, "7")
	msg.Metadata.Set(outbox.MetadataTopic, b.topic)
	msg.Metadata.Set(outbox.MetadataTable, "another-service-table")
	go func() { _ = s.gc.Publish(b.topic, msg) }()
	time.Sleep(window) // a span of failures: nothing to wait for
	reads := inbox.reads.Load()
	t.Logf("inbox read %d times in %v", reads, window)
	assert.Positive(t, reads)
	assert.Less(t, float64(reads)/window.Seconds(), float64(checksPerSecondBound), "inbox checks per second")
}

// TestCheckRetryConfigurationIsChecked refuses a negative delay and a cap
// below the delay.
func TestCheckRetryConfigurationIsChecked(t *testing.T) {
	t.Parallel()
	reg, err := outbox.NewRegistry()
	require.NoError(t, err)
	for _, bad := range []outbox.MiddlewareConfig{
		{Check: outbox.CheckConfig{RetryDelay: -time.Millisecond}},
		{Check: outbox.CheckConfig{RetryDelay: time.Second, RetryMaxDelay: time.Millisecond}},
	} {
		_, err = outbox.NewMiddleware(reg, bad, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "%+v", bad)
	}
	_, err = outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{RetryDelay: 10 * time.Second}}, nil)
	assert.NoError(t, err, "the cap defaults to at least the delay")
}
