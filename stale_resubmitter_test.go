package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// traceparent is a W3C trace context header, as OpenTelemetry's propagator
// puts it into message metadata.
const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// backdate moves a timestamp column of one record (of every record where it
// is set, when id is 0) to the year 2000, which reads the same on every
// database.
func (b *bundle) backdate(t *testing.T, column string, id int64) {
	t.Helper()
	q := "UPDATE " + b.store.Table() + " SET " + column + " = '2000-01-01 00:00:00' WHERE "
	args := []any{}
	if id != 0 {
		q += "id = ?"
		args = append(args, id)
	} else {
		q += column + " IS NOT NULL"
	}
	_, err := b.db.ExecContext(b.ctx(t), b.db.Rebind(q), args...)
	require.NoError(t, err)
}

// failingPublisher refuses every message, like a broker that is down.
type failingPublisher struct{}

func (failingPublisher) Publish(string, ...*message.Message) error { return errors.New("broker down") }
func (failingPublisher) Close() error                              { return nil }

func TestStaleResubmitter(t *testing.T) {
	t.Parallel()

	t.Run("SendsOnlyRecordsStaleSinceTheirLastSendWithTheirMetadata", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			pub, err := outbox.NewPublisher(b.reg, failingPublisher{})
			require.NoError(t, err)
			stale := message.NewMessage(watermill.NewUUID(), []byte("stale"))
			stale.Metadata.Set("traceparent", traceparent)
			fresh := message.NewMessage(watermill.NewUUID(), []byte("fresh"))
			require.Error(t, pub.Publish(b.topic, stale, fresh), "the broker is down: records stay pending")
			b.backdate(t, "created_at", idOf(t, stale))

			gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			sub, err := gc.Subscribe(b.ctx(t), b.topic)
			require.NoError(t, err)
			r, err := outbox.NewStaleResubmitter(b.reg, gc, outbox.StaleResubmitterConfig{OlderThan: time.Hour}, b.logger)
			require.NoError(t, err)

			sent, err := r.ResubmitOnce(b.ctx(t))
			require.NoError(t, err)
			assert.Equal(t, 1, sent.Total(), "only the record older than OlderThan is sent")
			got := <-sub
			got.Ack()
			assert.Equal(t, stale.UUID, got.UUID)
			assert.Equal(t, idOf(t, stale), idOf(t, got))
			assert.Equal(t, traceparent, got.Metadata.Get("traceparent"), "trace headers survive record and resend")

			sent, err = r.ResubmitOnce(b.ctx(t))
			require.NoError(t, err)
			assert.Zero(t, sent.Total(), "a resent record waits OlderThan again, from its resend")
		})
	})

	// Topology: one service publishing messages delayed with Watermill's
	// components/delay, its broker down, a stale resubmitter running.
	t.Run("DelayedRecordIsNotResentBeforeItsDelay", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			pub, err := outbox.NewPublisher(b.reg, failingPublisher{})
			require.NoError(t, err)
			later := message.NewMessage(watermill.NewUUID(), []byte("in an hour"))
			delay.Message(later, delay.For(time.Hour))
			due := message.NewMessage(watermill.NewUUID(), []byte("was due a minute ago"))
			delay.Message(due, delay.Until(time.Now().Add(-time.Minute)))
			require.Error(t, pub.Publish(b.topic, later, due), "the broker is down: records stay pending")
			b.backdate(t, "created_at", 0)

			gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			sub, err := gc.Subscribe(b.ctx(t), b.topic)
			require.NoError(t, err)
			r, err := outbox.NewStaleResubmitter(b.reg, gc, outbox.StaleResubmitterConfig{OlderThan: time.Hour}, b.logger)
			require.NoError(t, err)

			sent, err := r.ResubmitOnce(b.ctx(t))
			require.NoError(t, err)
			assert.Equal(t, 1, sent.Total(), "only the record whose delay has ended is resent")
			got := <-sub
			got.Ack()
			assert.Equal(t, due.UUID, got.UUID)
			assert.Equal(t, 2, b.pendingCount(t), "the delayed record is still pending, not lost")
		})
	})

	// Topology: one service whose records are not being completed (its
	// consumer is down), a stale resubmitter whose OlderThan is shorter
	// than one round takes: the records of the round's first claims are
	// stale again before its last claim.
	t.Run("OneRoundSendsEachRecordOnceWhenOlderThanIsShorterThanTheRound", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			pub, err := outbox.NewPublisher(b.reg, failingPublisher{})
			require.NoError(t, err)
			const backlog = 23
			msgs := make([]*message.Message, backlog)
			for i := range msgs {
				msgs[i] = message.NewMessage(watermill.NewUUID(), nil)
			}
			require.Error(t, pub.Publish(b.topic, msgs...), "the broker is down: records stay pending")

			out := &countingPublisher{Publisher: &refuseAfter{n: 4 * backlog}}
			r, err := outbox.NewStaleResubmitter(b.reg, out, outbox.StaleResubmitterConfig{OlderThan: time.Microsecond, BatchSize: 5}, b.logger)
			require.NoError(t, err)
			for round := 1; round <= 2; round++ {
				sent, err := r.ResubmitOnce(b.ctx(t))
				require.NoError(t, err)
				assert.Equal(t, backlog, sent.Total(), "round %d sends each record once", round)
			}
			_, copies := out.counts()
			assert.Equal(t, 2*backlog, copies)
			assert.Equal(t, backlog, b.pendingCount(t))
		})
	})

	t.Run("StartupReplayCountsAsASend", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, 2)
			b.backdate(t, "created_at", 0)
			gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			replayed, err := outbox.Replay(b.ctx(t), b.reg, gc, outbox.ReplayConfig{}, b.logger)
			require.NoError(t, err)
			require.Equal(t, 2, replayed.Total())

			r, err := outbox.NewStaleResubmitter(b.reg, gc, outbox.StaleResubmitterConfig{OlderThan: time.Hour}, b.logger)
			require.NoError(t, err)
			sent, err := r.ResubmitOnce(b.ctx(t))
			require.NoError(t, err)
			assert.Zero(t, sent.Total(), "records just replayed are not stale, however old they are")
		})
	})

	// Topology: one service whose broker fails part way through its
	// startup replay; the replay stamps each page after sending it, while
	// the next one is sent.
	t.Run("PagesSentBeforeAFailedReplayCountAsSent", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			const backlog, page = 50, 10
			crashBeforeConsumption(t, b, backlog)
			b.backdate(t, "created_at", 0)
			replayed, err := outbox.Replay(b.ctx(t), b.reg, &refuseAfter{n: 3 * page}, outbox.ReplayConfig{PageSize: page, Mode: outbox.ReplayAll}, b.logger)
			var replayErr *outbox.ResendError
			require.ErrorAs(t, err, &replayErr)
			require.Equal(t, 3*page, replayed.Total())

			out := &countingPublisher{Publisher: discardPublisher{}}
			r, err := outbox.NewStaleResubmitter(b.reg, out, outbox.StaleResubmitterConfig{OlderThan: time.Hour}, b.logger)
			require.NoError(t, err)
			sent, err := r.ResubmitOnce(b.ctx(t))
			require.NoError(t, err)
			assert.Equal(t, backlog-3*page, sent.Total(), "the three pages sent were stamped; the rest are stale")
		})
	})

	t.Run("RunsWithTheRouterUntilItCloses", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			uuids := crashBeforeConsumption(t, b, 3)
			handled := newHandledSet(len(uuids))
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = gc.Close() })
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			router.AddMiddleware(b.middleware(t))
			r, err := outbox.NewStaleResubmitter(b.reg, gc, outbox.StaleResubmitterConfig{OlderThan: time.Millisecond, Interval: 20 * time.Millisecond}, b.logger)
			require.NoError(t, err)
			router.AddPlugin(r.Plugin())
			router.AddNoPublisherHandler("consume", b.topic, gc, handled.handle)

			// No startup replay: the running service finds the lost records.
			runUntilHandled(t, b, router, handled)
			assert.Zero(t, b.pendingCount(t))
		})
	})

	t.Run("RunReturnsWhenItsContextEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Backends()[0], sqlstore.Mark)
		r, err := outbox.NewStaleResubmitter(b.reg, failingPublisher{}, outbox.StaleResubmitterConfig{Interval: time.Millisecond}, nil)
		require.NoError(t, err)
		assertRunStops(t, b, r.Run)
	})

	t.Run("ConfigurationIsChecked", func(t *testing.T) {
		t.Parallel()
		reg, err := outbox.NewRegistry()
		require.NoError(t, err)
		_, err = outbox.NewStaleResubmitter(reg, failingPublisher{}, outbox.StaleResubmitterConfig{BatchSize: -1}, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
		_, err = outbox.NewStaleResubmitter(nil, failingPublisher{}, outbox.StaleResubmitterConfig{}, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
		router, err := message.NewRouter(message.RouterConfig{}, nil)
		require.NoError(t, err)
		r, err := outbox.NewStaleResubmitter(reg, failingPublisher{}, outbox.StaleResubmitterConfig{}, nil)
		require.NoError(t, err)
		assert.ErrorIs(t, r.Plugin()(router), outbox.ErrInvalidConfig, "a router without handlers cannot carry it")
	})
}

func TestTraceHeadersSurviveStartupReplay(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		pub, err := outbox.NewPublisher(b.reg, failingPublisher{})
		require.NoError(t, err)
		msg := message.NewMessage(watermill.NewUUID(), []byte("traced"))
		msg.Metadata.Set("traceparent", traceparent)
		msg.Metadata.Set("tracestate", "congo=t61rcWkgMzE")
		require.Error(t, pub.Publish(b.topic, msg))

		gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
		t.Cleanup(func() { _ = gc.Close() })
		sub, err := gc.Subscribe(b.ctx(t), b.topic)
		require.NoError(t, err)
		_, err = outbox.Replay(b.ctx(t), b.reg, gc, outbox.ReplayConfig{}, nil)
		require.NoError(t, err)
		got := <-sub
		got.Ack()
		assert.Equal(t, traceparent, got.Metadata.Get("traceparent"))
		assert.Equal(t, "congo=t61rcWkgMzE", got.Metadata.Get("tracestate"))
	})
}

// assertRunStops runs a background runner and checks that it returns nil
// once its context ends.
func assertRunStops(t *testing.T, b *bundle, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(b.ctx(t))
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-b.ctx(t).Done():
		t.Fatal("Run did not return after its context ended")
	}
}
