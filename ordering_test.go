package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// signalLogger is a CaptureLogger that signals each Debug line msg.
type signalLogger struct {
	testenv.CaptureLogger
	msg string
	hit chan struct{}
}

func (l *signalLogger) Debug(msg string, fields watermill.LogFields) {
	l.CaptureLogger.Debug(msg, fields)
	if msg == l.msg {
		l.hit <- struct{}{}
	}
}

func (l *signalLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// orderedHandler records, per key, the sequence numbers it handled and
// whether two handlings of one key ever overlapped.
type orderedHandler struct {
	mu       sync.Mutex
	handled  map[string][]string
	running  map[string]int
	overlaps int
	started  chan string              // the seq of each handling, as it starts
	gates    map[string]chan struct{} // seq -> released when closed
}

// orderedCase is one ordered topic on a database: a running stale
// resubmitter whose publisher delivers what is sent again to again, and a
// publish of records of key "k" whose first copies it returns.
type orderedCase struct {
	b     *bundle
	reg   *outbox.Registry
	again <-chan *message.Message
	// publish publishes one message per seq, in order, and returns the
	// copies the broker sent (acked).
	publish func(seqs ...string) map[string]*message.Message
}

func newOrderedCase(t *testing.T, backend testenv.Backend, resubmit outbox.StaleResubmitterConfig) *orderedCase {
	t.Helper()
	b := setup(t, backend, sqlstore.Mark)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store, OrderKey: "order"})
	require.NoError(t, err)
	ctx := b.ctx(t)

	resent := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { _ = resent.Close() })
	again, err := resent.Subscribe(ctx, b.topic)
	require.NoError(t, err)
	running := &signalLogger{msg: "Stale resubmitter running", hit: make(chan struct{}, 1)}
	rs, err := outbox.NewStaleResubmitter(reg, resent, resubmit, running)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- rs.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-stopped })
	<-running.hit

	first := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { _ = first.Close() })
	sent, err := first.Subscribe(ctx, b.topic)
	require.NoError(t, err)
	pub, err := outbox.NewPublisher(reg, first)
	require.NoError(t, err)
	return &orderedCase{b: b, reg: reg, again: again, publish: func(seqs ...string) map[string]*message.Message {
		t.Helper()
		msgs := map[string]*message.Message{}
		for _, seq := range seqs {
			msg := message.NewMessage(watermill.NewUUID(), []byte(seq))
			msg.Metadata.Set("order", "k")
			msg.Metadata.Set("seq", seq)
			require.NoError(t, pub.Publish(b.topic, msg))
			msgs[seq] = <-sent
			msgs[seq].Ack()
		}
		return msgs
	}}
}

func (o *orderedHandler) handle(msg *message.Message) ([]*message.Message, error) {
	key, seq := msg.Metadata["order"], msg.Metadata["seq"]
	o.mu.Lock()
	o.running[key]++
	if o.running[key] > 1 {
		o.overlaps++
	}
	gate := o.gates[seq]
	o.mu.Unlock()
	o.started <- seq
	if gate != nil {
		<-gate
	}
	o.mu.Lock()
	o.running[key]--
	o.handled[key] = append(o.handled[key], seq)
	o.mu.Unlock()
	return nil, nil
}

// TestOrderKeyHoldsLaterRecords publishes records of one key and delivers
// them as a broker that reorders would: a later record's copy first, and a
// later one while the earlier one's handler runs. The later records wait:
// the first is put back and sent again once the earlier record completes,
// the second waits in its handler and runs when the earlier one completes.
// Without the hold both would run at once, out of order.
func TestOrderKeyHoldsLaterRecords(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		// The sender of held records: a stale resubmitter's publisher.
		c := newOrderedCase(t, backend, outbox.StaleResubmitterConfig{})
		b, reg, again := c.b, c.reg, c.again
		msgs := c.publish("1", "2", "3")

		logger := &signalLogger{msg: "Record held by an earlier record of its key, waiting for it", hit: make(chan struct{}, 8)}
		h := &orderedHandler{handled: map[string][]string{}, running: map[string]int{}, started: make(chan string, 8),
			gates: map[string]chan struct{}{"2": make(chan struct{})}}
		deliver := func(held time.Duration, msg *message.Message) <-chan error {
			// Record 1's copies are not lost: its resend is never asked
			// for (TestHeldCopyAsksForTheEarlierRecordAgain asks).
			mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{HeldWait: held, HeldResendAfter: time.Hour}, logger)
			require.NoError(t, err)
			msg.SetContext(context.Background())
			done := make(chan error, 1)
			go func() { _, err := mw(h.handle)(msg); done <- err }()
			return done
		}

		// Record 2's copy comes first: held, put back after a short wait,
		// its handler not run.
		done := deliver(time.Millisecond, msgs["2"].Copy())
		var putBack error
		select {
		case <-logger.hit:
			putBack = <-done
		case seq := <-h.started:
			t.Fatalf("record %s ran while record 1 was pending", seq)
		case err := <-done:
			t.Fatalf("record 2's copy returned (%v) without being held", err)
		}
		require.NoError(t, putBack, "a held copy is put back without an error")
		require.Empty(t, h.started, "record 2 did not run")

		// Record 1 runs, and its completion sends record 2 again.
		require.NoError(t, <-deliver(time.Millisecond, msgs["1"].Copy()))
		assert.Equal(t, "1", <-h.started)
		var two *message.Message
		select {
		case two = <-again:
			two.Ack()
		case <-time.After(guard):
			t.Fatal("record 2 was not sent again once record 1 completed")
		}
		assert.Equal(t, "2", two.Metadata["seq"])

		// Record 2 runs (held at its gate) and record 3 comes meanwhile: it
		// waits in its handler for record 2, and runs once 2 completes.
		twoDone := deliver(time.Millisecond, two)
		select {
		case seq := <-h.started:
			assert.Equal(t, "2", seq)
		case err := <-twoDone:
			t.Fatalf("record 2's copy sent again returned (%v) without running", err)
		case <-time.After(guard):
			t.Fatal("record 2's copy sent again did not run")
		}
		threeDone := deliver(time.Minute, msgs["3"].Copy())
		select {
		case <-logger.hit:
		case seq := <-h.started:
			t.Fatalf("record %s ran while record 2 ran", seq)
		case err := <-threeDone:
			t.Fatalf("record 3's copy returned (%v) before record 2 completed, without waiting for it", err)
		}
		close(h.gates["2"])
		require.NoError(t, <-twoDone)
		require.NoError(t, <-threeDone)
		assert.Equal(t, "3", <-h.started)

		assert.Equal(t, []string{"1", "2", "3"}, h.handled["k"], "handled in the order saved")
		assert.Zero(t, h.overlaps, "no two handlings of the key overlapped")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), reg))
		assert.Zero(t, b.pendingCount(t))
	})
}

// TestHeldCopyAsksForTheEarlierRecordAgain loses the copy of a key's first
// record: the copy of the second, held by it, asks for the first to be
// sent again at once (its last send is older than HeldResendAfter), the
// first runs, and its completion sends the second, which runs after it.
// Without the ask, nothing would send the first before the stale
// resubmitter's OlderThan.
func TestHeldCopyAsksForTheEarlierRecordAgain(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		// Its resubmitter never finds a record stale while the test runs.
		c := newOrderedCase(t, backend, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		b, reg, again := c.b, c.reg, c.again
		two := c.publish("1", "2")["2"] // record 1's copy is lost here

		h := &orderedHandler{handled: map[string][]string{}, running: map[string]int{}, started: make(chan string, 8), gates: map[string]chan struct{}{}}
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{HeldWait: time.Millisecond, HeldResendAfter: time.Nanosecond}, watermill.NopLogger{})
		require.NoError(t, err)
		deliver := func(msg *message.Message) error {
			msg.SetContext(context.Background())
			_, err := mw(h.handle)(msg)
			return err
		}
		receive := func(what string) *message.Message {
			t.Helper()
			select {
			case msg := <-again:
				msg.Ack()
				return msg
			case <-time.After(guard):
				t.Fatalf("%s was not sent again", what)
				return nil
			}
		}

		require.NoError(t, deliver(two.Copy()), "record 2's copy is put back")
		require.Empty(t, h.started, "record 2 did not run while record 1 was pending")
		one := receive("record 1, whose copy was lost,")
		assert.Equal(t, "1", one.Metadata["seq"])
		require.NoError(t, deliver(one))
		for {
			// Record 1's completion sends record 2; a copy of record 1
			// asked for twice may come first.
			msg := receive("record 2, once record 1 completed,")
			require.NoError(t, deliver(msg))
			if msg.Metadata["seq"] == "2" {
				break
			}
		}
		assert.Equal(t, []string{"1", "2"}, h.handled["k"], "handled in the order saved")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), reg))
		assert.Zero(t, b.pendingCount(t))
	})
}
