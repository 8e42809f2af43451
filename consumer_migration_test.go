package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// copies counts, per consumer, the copies of tracked messages that reached
// it and were settled: handled (tracked or not), skipped as duplicates, or
// acked as unknown. It is the signal that a restart has delivered its
// replay to every consumer.
type copies struct {
	mu      sync.Mutex
	settled map[string]int
	handled map[string]map[string]int // consumer -> uuid -> runs
	want    map[string]int
	done    chan struct{}
}

func newCopies() *copies {
	return &copies{settled: map[string]int{}, handled: map[string]map[string]int{}}
}

// expect resets the wait: done is closed once each consumer settled n more
// copies.
func (c *copies) expect(n int, consumers ...string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.want = map[string]int{}
	for _, k := range consumers {
		c.want[k] = c.settled[k] + n
	}
	c.done = make(chan struct{})
	c.check()
	return c.done
}

func (c *copies) check() {
	for k, n := range c.want {
		if c.settled[k] < n {
			return
		}
	}
	if c.want != nil {
		close(c.done)
		c.want = nil
	}
}

func (c *copies) settle(consumer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settled[consumer]++
	c.check()
}

// handler returns the handler of one consumer, which counts its runs.
func (c *copies) handler(consumer string) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		c.mu.Lock()
		if c.handled[consumer] == nil {
			c.handled[consumer] = map[string]int{}
		}
		c.handled[consumer][msg.UUID]++
		c.mu.Unlock()
		c.settle(consumer)
		return nil
	}
}

func (c *copies) runs(consumer string) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.handled[consumer] {
		out[k] = v
	}
	return out
}

func (c *copies) Published(string, int)                   {}
func (c *copies) Completed(string, string)                {}
func (c *copies) DuplicateSkipped(_, consumer string)     { c.settle(consumer) }
func (c *copies) Failed(string, string)                   {}
func (c *copies) Abandoned(string, string)                {}
func (c *copies) Mismatched(string, string)               {}
func (c *copies) Resent(string, observe.ResendKind, int)  {}
func (c *copies) NotOwned(string, string)                 {}
func (c *copies) UnknownRecord(_ string, consumer string) { c.settle(consumer) }

// restartWith starts a fresh service (new GoChannel, new router with the
// middleware, the replay plugin and a handler per consumer, on the same
// store), waits until every consumer settled a copy of each record that
// was pending at start, and stops it.
func restartWith(t *testing.T, b *bundle, c *copies, consumers ...string) {
	t.Helper()
	pending := b.pendingCount(t)
	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(b.middleware(t))
	router.AddPlugin(outbox.ReplayPlugin(b.reg, gc, outbox.ReplayConfig{}, b.logger))
	for _, name := range consumers {
		router.AddNoPublisherHandler(name, b.topic, gc, c.handler(name))
	}
	done := c.expect(pending, consumers...)
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	select {
	case <-done:
	case err := <-runErr:
		t.Fatalf("router stopped: %v", err)
	case <-b.ctx(t).Done():
		t.Fatalf("the consumers did not settle the %d replayed records", pending)
	}
	<-router.Running()
	require.NoError(t, router.Close())
	require.NoError(t, <-runErr)
}

// restartThrice restarts the service three times with a handler per
// consumer, and asserts that each consumer handled each record once over
// the three.
func restartThrice(t *testing.T, b *bundle, c *copies, uuids []string, consumers ...string) {
	t.Helper()
	for range 3 {
		restartWith(t, b, c, consumers...)
	}
	for _, consumer := range consumers {
		got := c.runs(consumer)
		for _, u := range uuids {
			assert.Equal(t, 1, got[u], "%s handled %s once over three restarts", consumer, u)
		}
	}
}

// redeclare gives the bundle a registry in which its topic declares
// consumers (none for an empty list), observed by c: a redeploy.
func (b *bundle) redeclare(t *testing.T, c *copies, consumers ...string) {
	t.Helper()
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store, Consumers: consumers})
	require.NoError(t, err)
	reg.SetObserver(c)
	b.reg = reg
}

// errorsContaining returns the error lines whose error text contains s.
func errorsContaining(l *testenv.CaptureLogger, s string) []string {
	var out []string
	for _, e := range l.Entries("error") {
		if e.Err != nil && strings.Contains(e.Err.Error(), s) {
			out = append(out, e.Err.Error())
		}
	}
	return out
}

// TestAddingConsumersToAPendingBacklog: a topic without consumers leaves 20
// records pending; the service is redeployed with the topic declaring
// "email" and "stats", two handlers in one router fed by GoChannel fan-out,
// and restarted three times on the same store.
func TestAddingConsumersToAPendingBacklog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode sqlstore.Completion
	}{{"DeletingTable", sqlstore.Delete}, {"MarkingTable", sqlstore.Mark}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
				b := setup(t, backend, tc.mode)
				const n = 20
				uuids := crashBeforeConsumption(t, b, n)
				require.Equal(t, n, b.pendingCount(t))

				c := newCopies()
				b.redeclare(t, c, "email", "stats")
				restartThrice(t, b, c, uuids, "email", "stats")
				assert.Zero(t, b.pendingCount(t), "every record completes once both consumers completed it")
				assert.Empty(t, errorsContaining(b.logger, "declares no consumers"), "the consumers are declared")
				if tc.mode == sqlstore.Delete {
					assert.Zero(t, b.rowCount(t), "no record is left")
					return
				}
				status, err := b.store.Status(b.ctx(t))
				require.NoError(t, err)
				require.Len(t, status, 1)
				assert.Equal(t, []recordstore.ConsumerStatus{
					{Consumer: "email", Completed: n}, {Consumer: "stats", Completed: n},
				}, withoutReceivers(status[0].Consumers), "each record has a completed delivery per declared consumer")
			})
		})
	}
}

// undeclaredReports returns the start's reports of consumer's pending
// deliveries, which the topic no longer declares.
func undeclaredReports(l *testenv.CaptureLogger, consumer string) []string {
	var out []string
	for _, text := range errorsContaining(l, "outboxctl retire") {
		if strings.Contains(text, `consumer "`+consumer+`" has`) {
			out = append(out, text)
		}
	}
	return out
}

// TestRemovingAConsumer: a topic declaring "email" and "stats" leaves 5
// records pending; the service is redeployed with "email" alone, one
// handler in a router on GoChannel, and restarted on the same store.
func TestRemovingAConsumer(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setupConsumers(t, backend, sqlstore.Mark, "email", "stats")
		const n = 5
		uuids := crashBeforeConsumption(t, b, n)

		c := newCopies()
		b.redeclare(t, c, "email")
		restartWith(t, b, c, "email")
		reports := undeclaredReports(b.logger, "stats")
		require.Len(t, reports, 1, "the start reports the retired consumer")
		assert.Contains(t, reports[0], `5 pending deliveries`)
		assert.Contains(t, reports[0], `outboxops.RetireConsumer(ctx, reg, "`+b.topic+`", "stats")`)
		assert.Equal(t, n, b.pendingCount(t), "stats' deliveries keep the records pending")

		_, err := outboxops.RetireConsumer(b.ctx(t), b.reg, b.topic, "email")
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, "a declared consumer is not retired")
		retired, err := outboxops.RetireConsumer(b.ctx(t), b.reg, b.topic, "stats")
		require.NoError(t, err)
		assert.Equal(t, n, retired)
		assert.Zero(t, b.pendingCount(t), "retiring completes the records")

		restartWith(t, b, c, "email")
		assert.Len(t, undeclaredReports(b.logger, "stats"), 1, "nothing left to report")
		got := c.runs("email")
		for _, u := range uuids {
			assert.Equal(t, 1, got[u], "email handled %s once", u)
		}
	})
}

// TestRenamingAConsumer: a topic declaring "email" and "stats" leaves 5
// records pending; "stats" is renamed "statistics" (declared in its place)
// and the service restarted three times, then the old name is retired.
func TestRenamingAConsumer(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setupConsumers(t, backend, sqlstore.Delete, "email", "stats")
		const n = 5
		uuids := crashBeforeConsumption(t, b, n)

		c := newCopies()
		b.redeclare(t, c, "email", "statistics")
		restartThrice(t, b, c, uuids, "email", "statistics")
		assert.Len(t, undeclaredReports(b.logger, "stats"), 3, "every start reports the old name")
		for _, e := range b.logger.Entries("error") {
			assert.NotContains(t, e.Msg, "handling it untracked", "the new name's deliveries are tracked")
		}

		retired, err := outboxops.RetireConsumer(b.ctx(t), b.reg, b.topic, "stats")
		require.NoError(t, err)
		assert.Equal(t, n, retired)
		assert.Zero(t, b.pendingCount(t))
		assert.Zero(t, b.rowCount(t), "the deleting table is empty")
	})
}
