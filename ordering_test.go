package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
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
	// pub is the decorated publisher, and sent what the broker delivers of
	// its sends.
	pub  message.Publisher
	sent <-chan *message.Message
}

func newOrderedCase(t *testing.T, backend testenv.Backend, resubmit outbox.StaleResubmitterConfig) *orderedCase {
	t.Helper()
	return newOrderedCaseOn(t, setup(t, backend, sqlstore.Mark), nil, resubmit)
}

// runResubmitter runs a stale resubmitter of reg, sending on pub, until
// the test ends, and returns once it runs.
func runResubmitter(t *testing.T, ctx context.Context, reg *outbox.Registry, pub message.Publisher, cfg outbox.StaleResubmitterConfig) {
	t.Helper()
	running := &signalLogger{msg: "Stale resubmitter running", hit: make(chan struct{}, 1)}
	rs, err := outbox.NewStaleResubmitter(reg, pub, cfg, running)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- rs.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-stopped })
	<-running.hit
}

// orderedInstance is an instance of a service on an ordered topic (order
// key "order"): its registry on store, its middleware, and its publisher
// on a GoChannel of its own, whose sends arrive on sent.
type orderedInstance struct {
	reg    *outbox.Registry
	mw     message.HandlerMiddleware
	broker *gochannel.GoChannel
	pub    message.Publisher
	sent   <-chan *message.Message
}

func newOrderedInstance(t *testing.T, ctx context.Context, store recordstore.Store, topic string, cfg outbox.MiddlewareConfig, logger watermill.LoggerAdapter) *orderedInstance {
	t.Helper()
	in := &orderedInstance{}
	var err error
	in.reg, err = outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: store, OrderKey: "order"})
	require.NoError(t, err)
	in.mw, err = outbox.NewMiddleware(in.reg, cfg, logger)
	require.NoError(t, err)
	in.broker = gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { _ = in.broker.Close() })
	in.sent, err = in.broker.Subscribe(ctx, topic)
	require.NoError(t, err)
	in.pub, err = outbox.NewPublisher(in.reg, in.broker)
	require.NoError(t, err)
	return in
}

// runRouter runs, until the test ends, a router of the instance with its
// middleware, ReplayPlugin (sending on the instance's GoChannel) and one
// handler, named handler, that receives topic from sub and does nothing;
// it returns once the router runs.
func (in *orderedInstance) runRouter(t *testing.T, ctx context.Context, sub message.Subscriber, handler, topic string) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(in.mw)
	router.AddPlugin(outbox.ReplayPlugin(in.reg, in.broker, outbox.ReplayConfig{Resubmit: outbox.StaleResubmitterConfig{OlderThan: time.Hour}}, watermill.NopLogger{}))
	router.AddNoPublisherHandler(handler, topic, sub, func(*message.Message) error { return nil })
	go func() { _ = router.Run(ctx) }()
	t.Cleanup(func() { _ = router.Close() })
	<-router.Running()
}

// newOrderedCaseOn is newOrderedCase on b, with store as the topic's store
// (b's own when nil).
func newOrderedCaseOn(t *testing.T, b *bundle, store recordstore.Store, resubmit outbox.StaleResubmitterConfig) *orderedCase {
	t.Helper()
	if store == nil {
		store = b.store
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: store, OrderKey: "order"})
	require.NoError(t, err)
	ctx := b.ctx(t)

	resent := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { _ = resent.Close() })
	again, err := resent.Subscribe(ctx, b.topic)
	require.NoError(t, err)
	runResubmitter(t, ctx, reg, resent, resubmit)

	first := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { _ = first.Close() })
	sent, err := first.Subscribe(ctx, b.topic)
	require.NoError(t, err)
	pub, err := outbox.NewPublisher(reg, first)
	require.NoError(t, err)
	return &orderedCase{b: b, reg: reg, again: again, pub: pub, sent: sent, publish: func(seqs ...string) map[string]*message.Message {
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

// newOrderedHandler is an orderedHandler that has run nothing, with no
// gates.
func newOrderedHandler() *orderedHandler {
	return &orderedHandler{handled: map[string][]string{}, running: map[string]int{}, started: make(chan string, 8), gates: map[string]chan struct{}{}}
}

// through returns a function that delivers a message to h through mw, as
// the router would, and requires that the middleware returns no error.
func through(t *testing.T, mw message.HandlerMiddleware, h *orderedHandler) func(*message.Message) {
	return func(msg *message.Message) {
		t.Helper()
		msg.SetContext(context.Background())
		_, err := mw(h.handle)(msg)
		require.NoError(t, err)
	}
}

// throughDrained is through, and then takes the handler's starts, so that
// h.started reports only the runs of the next delivery.
func throughDrained(t *testing.T, mw message.HandlerMiddleware, h *orderedHandler) func(*message.Message) {
	deliver := through(t, mw, h)
	return func(msg *message.Message) {
		t.Helper()
		deliver(msg)
		for len(h.started) > 0 {
			<-h.started
		}
	}
}

// receiveSent returns, acked, the next message from, failing the test when
// none comes within guard: what was not sent.
func receiveSent(t *testing.T, from <-chan *message.Message, what string) *message.Message {
	t.Helper()
	return receiveWithin(t, from, guard, what)
}

// publishTogether publishes one message of key "k" per seq in one Publish.
func (c *orderedCase) publishTogether(t *testing.T, seqs ...string) {
	t.Helper()
	publishSeqs(t, c.pub, c.b.topic, seqs...)
}

// publishSeqs publishes to topic one message of key "k" per seq, in one
// Publish of pub.
func publishSeqs(t *testing.T, pub message.Publisher, topic string, seqs ...string) {
	t.Helper()
	var msgs []*message.Message
	for _, seq := range seqs {
		msg := message.NewMessage(watermill.NewUUID(), []byte(seq))
		msg.Metadata.Set("order", "k")
		msg.Metadata.Set("seq", seq)
		msgs = append(msgs, msg)
	}
	require.NoError(t, pub.Publish(topic, msgs...))
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
// Without the hold both would run at once, out of order. Every copy is
// checked here (Check.FirstCopies); TestOrderedFirstCopiesWaitOffTheHandlersPath
// has the first copies of the defaults.
func TestOrderKeyHoldsLaterRecords(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		// The sender of held records: a stale resubmitter's publisher.
		c := newOrderedCase(t, backend, outbox.StaleResubmitterConfig{})
		b, reg, again := c.b, c.reg, c.again
		msgs := c.publish("1", "2", "3")

		logger := &signalLogger{msg: "Record held by an earlier record of its key, waiting for it", hit: make(chan struct{}, 8)}
		h := newOrderedHandler()
		h.gates["2"] = make(chan struct{})
		deliver := func(held time.Duration, msg *message.Message) <-chan error {
			// Record 1's copies are not lost: its resend is never asked
			// for (TestHeldCopyAsksForTheEarlierRecordAgain asks).
			mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{HeldWait: held, HeldResendAfter: time.Hour, FirstCopies: true}}, logger)
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
// sent again at once (its last send is older than Check.HeldResendAfter), the
// first runs, and its completion sends the second, which runs after it.
// Without the ask, nothing would send the first before the stale
// resubmitter's OlderThan. Every copy is checked (Check.FirstCopies);
// TestOrderedFirstCopiesWaitOffTheHandlersPath loses a first copy with the
// defaults.
func TestHeldCopyAsksForTheEarlierRecordAgain(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		// Its resubmitter never finds a record stale while the test runs.
		c := newOrderedCase(t, backend, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		b, reg, again := c.b, c.reg, c.again
		two := c.publish("1", "2")["2"] // record 1's copy is lost here

		h := newOrderedHandler()
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{HeldWait: time.Millisecond, HeldResendAfter: time.Nanosecond, FirstCopies: true}}, watermill.NopLogger{})
		require.NoError(t, err)
		deliver := func(msg *message.Message) error {
			msg.SetContext(context.Background())
			_, err := mw(h.handle)(msg)
			return err
		}
		receive := func(what string) *message.Message { return receiveSent(t, again, what+" again") }

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

// TestOrderedFirstCopiesWaitOffTheHandlersPath, one handler of a topic
// with an order key and a running sender (a stale resubmitter), every
// option at its default: the first copies of records 3 and 2 arrive before
// record 1's. Each returns at once without running its handler or
// reading its record, so that the subscription goes on to deliver record
// 1; record 2 is sent again once record 1's completion committed, and
// record 3 once record 2's did, and both run unchecked, in the order
// saved. Then record 5's first copy arrives and record 4's is lost: after
// Check.HeldWait the copy of 5 is sent again as a delivered copy, checked, held
// by 4, which it asks to be sent again, and runs after it.
func TestOrderedFirstCopiesWaitOffTheHandlersPath(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		store := &checkCounter{Store: b.store}
		c := newOrderedCaseOn(t, b, store, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		reg, again := c.reg, c.again
		h := newOrderedHandler()
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{HeldWait: time.Second, HeldResendAfter: time.Nanosecond}}, watermill.NopLogger{})
		require.NoError(t, err)
		deliver := through(t, mw, h)
		receive := func(what string) *message.Message { return receiveSent(t, again, what+" again") }
		pending := func() map[string]bool {
			recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, 100)
			require.NoError(t, err)
			out := map[string]bool{}
			for _, r := range recs {
				out[r.Metadata["seq"]] = true
			}
			return out
		}

		msgs := c.publish("1", "2", "3")
		deliver(msgs["3"])
		deliver(msgs["2"])
		require.Empty(t, h.started, "records 3 and 2 did not run while record 1 was pending")
		require.Zero(t, store.checks.Load(), "their copies read no record")
		deliver(msgs["1"])
		two := receive("record 2, once record 1 completed,")
		require.Equal(t, "2", two.Metadata["seq"])
		assert.False(t, pending()["1"], "record 2 was sent again once record 1's completion committed")
		deliver(two)
		three := receive("record 3, once record 2 completed,")
		require.Equal(t, "3", three.Metadata["seq"])
		assert.False(t, pending()["2"], "record 3 was sent again once record 2's completion committed")
		deliver(three)
		assert.Equal(t, []string{"1", "2", "3"}, h.handled["k"], "handled in the order saved")
		assert.Zero(t, store.checks.Load(), "every copy ran unchecked")

		// Record 4's copy is lost; record 5's waits Check.HeldWait, is sent
		// again and checked.
		five := c.publish("4", "5")["5"]
		deliver(five)
		for h.handled["k"][len(h.handled["k"])-1] != "5" {
			deliver(receive("record 4 or 5"))
		}
		assert.Equal(t, []string{"1", "2", "3", "4", "5"}, h.handled["k"], "handled in the order saved")
		assert.NotZero(t, store.checks.Load(), "the copy of 5 sent again after HeldWait was checked")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), reg))
		assert.Zero(t, b.pendingCount(t))
	})
}

// TestOrderedMessagesHeldInThePublisher, one handler of a topic with an
// order key and a running sender, every option at its default: the
// publisher sends a later message of a key only once the earlier record
// completed here, so that it arrives once, after it, and runs unchecked.
func TestOrderedMessagesHeldInThePublisher(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		store := &checkCounter{Store: b.store}
		c := newOrderedCaseOn(t, b, store, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		reg := c.reg
		h := newOrderedHandler()
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{HeldWait: guard}}, watermill.NopLogger{})
		require.NoError(t, err)
		deliver := through(t, mw, h)
		receive := func(from <-chan *message.Message, what string) *message.Message { return receiveSent(t, from, what) }
		publish := func(seqs ...string) { c.publishTogether(t, seqs...) }
		pending := func(seq string) bool {
			recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, 100)
			require.NoError(t, err)
			for _, r := range recs {
				if r.Metadata["seq"] == seq {
					return true
				}
			}
			return false
		}

		// One Publish of 1 and 2: only 1 is sent; 2 once 1 completed.
		publish("1", "2")
		one := receive(c.sent, "record 1")
		require.Equal(t, "1", one.Metadata["seq"], "record 2 was held until record 1 completed")
		deliver(one)
		deliver(receive(c.sent, "record 2, once record 1 completed,"))

		// Again with 3 and 4.
		publish("3", "4")
		three := receive(c.sent, "record 3")
		require.Equal(t, "3", three.Metadata["seq"], "record 4 was held until record 3 completed")
		deliver(three)
		four := receive(c.sent, "record 4, once record 3 completed,")
		require.Equal(t, "4", four.Metadata["seq"])
		assert.False(t, pending("3"), "record 4 was sent once record 3's completion committed")
		deliver(four)
		assert.Equal(t, []string{"1", "2", "3", "4"}, h.handled["k"], "handled in the order saved")
		assert.Zero(t, store.checks.Load(), "every copy ran unchecked")

		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), reg))
	})
}

// TestAHeldMessageWhoseEarlierRecordDoesNotCompleteIsSentAfterHeldWait,
// one handler of a topic with an order key and a running sender: a message
// the publisher holds, whose earlier record's copy is lost (or taken by
// another instance), is sent after HeldWait all the same, and then the
// publisher holds nothing for a while.
func TestAHeldMessageWhoseEarlierRecordDoesNotCompleteIsSentAfterHeldWait(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		c := newOrderedCaseOn(t, b, nil, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		h := newOrderedHandler()
		mw, err := outbox.NewMiddleware(c.reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{HeldWait: 200 * time.Millisecond}}, watermill.NopLogger{})
		require.NoError(t, err)
		deliver := through(t, mw, h)
		receive := func(from <-chan *message.Message, what string) *message.Message { return receiveSent(t, from, what) }
		publish := func(seqs ...string) { c.publishTogether(t, seqs...) }

		// One Publish of 1 and 2: 2 is sent once 1 completed.
		publish("1", "2")
		deliver(receive(c.sent, "record 1"))
		deliver(receive(c.sent, "record 2, once record 1 completed,"))

		// Record 3's copy is lost: 4, held for it, is sent after HeldWait,
		// as no copy comes here meanwhile (none is queued in front of 3).
		publish("3", "4")
		receive(c.sent, "record 3") // lost
		four := receiveWithin(t, c.sent, 10*200*time.Millisecond, "record 4, once HeldWait passed,")
		require.Equal(t, "4", four.Metadata["seq"])
		// Then 5 and 6 are both sent at once.
		publish("5", "6")
		got := map[string]bool{}
		for range 2 {
			got[receive(c.sent, "records 5 and 6").Metadata["seq"]] = true
		}
		assert.Equal(t, map[string]bool{"5": true, "6": true}, got, "nothing held after a held message waited in vain")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), c.reg))
	})
}

// TestAHeldMessageWhoseEarlierRecordRanInAnotherInstanceGoesOn, two
// instances of one service on one table, sharing a queue: instance A
// publishes records 1 and 2 of a key in one Publish and holds 2 for 1;
// the broker gives 1 to B, which runs it. A sends 2 after HeldWait all the
// same, 2 runs in A after 1 ran in B, and then A holds nothing for a
// while: 3 and 4 go out at once.
func TestAHeldMessageWhoseEarlierRecordRanInAnotherInstanceGoesOn(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		const heldWait = 100 * time.Millisecond
		b := setup(t, backend, sqlstore.Mark)
		c := newOrderedCaseOn(t, b, nil, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		mwA, hA, regB, hB := twoInstances(t, b, c, heldWait)
		deliverA := through(t, mwA, hA)
		deliverB := through(t, regB.mw, hB)

		c.publishTogether(t, "1", "2")
		one := receiveSent(t, c.sent, "record 1")
		require.Equal(t, "1", one.Metadata["seq"], "record 2 was held for record 1")
		deliverB(one)
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), regB.reg))
		two := receiveWithin(t, c.sent, 10*heldWait, "record 2, once HeldWait passed,")
		require.Equal(t, "2", two.Metadata["seq"])
		// 1 never comes to A: its first copy of 2 waits for it off the
		// handler's path, then goes again as a checked copy, and runs.
		deliverA(two)
		deliverA(receiveWithin(t, c.again, 50*heldWait, "record 2, checked,"))
		assert.Equal(t, []string{"1"}, hB.handled["k"], "record 1 ran in B")
		assert.Equal(t, []string{"2"}, hA.handled["k"], "record 2 ran in A")

		c.publishTogether(t, "3", "4")
		got := map[string]bool{}
		for range 2 {
			got[receiveSent(t, c.sent, "records 3 and 4").Metadata["seq"]] = true
		}
		assert.Equal(t, map[string]bool{"3": true, "4": true}, got, "nothing held after a held message waited in vain")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), c.reg))
	})
}

// instanceB is a second instance of the service of an orderedCase: its
// own registry and middleware on the same table and topic.
type instanceB struct {
	reg *outbox.Registry
	mw  message.HandlerMiddleware
}

// twoInstances returns the middleware of c's instance (A) and a second
// instance (B) on the same table, each with a handler, both with the
// given HeldWait.
func twoInstances(t *testing.T, b *bundle, c *orderedCase, heldWait time.Duration) (message.HandlerMiddleware, *orderedHandler, instanceB, *orderedHandler) {
	t.Helper()
	cfg := outbox.MiddlewareConfig{Check: outbox.CheckConfig{HeldWait: heldWait}}
	mwA, err := outbox.NewMiddleware(c.reg, cfg, watermill.NopLogger{})
	require.NoError(t, err)
	regB, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store, OrderKey: "order"})
	require.NoError(t, err)
	mwB, err := outbox.NewMiddleware(regB, cfg, watermill.NopLogger{})
	require.NoError(t, err)
	return mwA, newOrderedHandler(), instanceB{reg: regB, mw: mwB}, newOrderedHandler()
}

// receiveWithin is receiveSent with a deadline of its own.
func receiveWithin(t *testing.T, from <-chan *message.Message, within time.Duration, what string) *message.Message {
	t.Helper()
	select {
	case msg := <-from:
		msg.Ack()
		return msg
	case <-time.After(within):
		t.Fatalf("%s was not sent within %v", what, within)
		return nil
	}
}

// TestAHeldMessageWaitsForItsEarlierRecordBehindABacklog, one handler of
// a topic with an order key and a running sender, the publisher holding
// later messages: the copy of the
// earlier record is queued behind a backlog that takes longer than
// HeldWait to come, while first copies keep coming. The held message waits
// for it rather than going out after HeldWait, and both run unchecked.
func TestAHeldMessageWaitsForItsEarlierRecordBehindABacklog(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		const heldWait = 200 * time.Millisecond
		b := setup(t, backend, sqlstore.Mark)
		store := &checkCounter{Store: b.store}
		c := newOrderedCaseOn(t, b, store, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		h := newOrderedHandler()
		mw, err := outbox.NewMiddleware(c.reg, outbox.MiddlewareConfig{Check: outbox.CheckConfig{HeldWait: heldWait}}, watermill.NopLogger{})
		require.NoError(t, err)
		deliver := throughDrained(t, mw, h)

		// One Publish of 1 and 2: 2 is sent once 1 completed.
		c.publishTogether(t, "1", "2")
		deliver(receiveSent(t, c.sent, "record 1"))
		deliver(receiveSent(t, c.sent, "record 2, once record 1 completed,"))
		checked := store.checks.Load()

		// A backlog of other keys' messages is queued in front of 3; 4
		// waits in the publisher for 3.
		var backlog []*message.Message
		for i := range 8 {
			msg := message.NewMessage(watermill.NewUUID(), []byte("backlog"))
			msg.Metadata.Set("order", fmt.Sprintf("other-%d", i))
			msg.Metadata.Set("seq", "b")
			require.NoError(t, c.pub.Publish(b.topic, msg))
			backlog = append(backlog, receiveSent(t, c.sent, "a backlog message"))
		}
		c.publishTogether(t, "3", "4")
		three := receiveSent(t, c.sent, "record 3")
		require.Equal(t, "3", three.Metadata["seq"])

		// The backlog comes one copy at a time, for twice HeldWait.
		for _, msg := range backlog {
			deliver(msg)
			select {
			case early := <-c.sent:
				t.Fatalf("record %s was sent while record 3 was still queued behind the backlog", early.Metadata["seq"])
			case <-time.After(heldWait / 4):
			}
		}
		deliver(three)
		four := receiveSent(t, c.sent, "record 4, once record 3 completed,")
		require.Equal(t, "4", four.Metadata["seq"])
		deliver(four)
		assert.Equal(t, []string{"1", "2", "3", "4"}, h.handled["k"], "handled in the order saved")
		assert.Equal(t, checked, store.checks.Load(), "3 and 4 ran unchecked")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), c.reg))
	})
}

// predecessorCounter counts the records whose earlier record of their
// key the outbox reads from the store.
type predecessorCounter struct {
	*checkCounter
	asked atomic.Int64
}

func (p *predecessorCounter) Predecessors(ctx context.Context, topic string, ids []int64) (map[int64]int64, error) {
	p.asked.Add(int64(len(ids)))
	return p.Store.Predecessors(ctx, topic, ids)
}

// TestAPublishReadsOnlyTheFirstRecordOfEachKeyItSaved, one handler of a
// topic with an order key: a Publish of three messages of one key reads
// the earlier record of the first one only (the others' is the one saved
// just before them, in the same insert), and the three run unchecked, in
// order.
func TestAPublishReadsOnlyTheFirstRecordOfEachKeyItSaved(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		store := &predecessorCounter{checkCounter: &checkCounter{Store: b.store}}
		c := newOrderedCaseOn(t, b, store, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		h := newOrderedHandler()
		mw, err := outbox.NewMiddleware(c.reg, outbox.MiddlewareConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		deliver := through(t, mw, h)

		c.publishTogether(t, "1", "2", "3")
		assert.Equal(t, int64(1), store.asked.Load(), "records read for their earlier record")
		// GoChannel may reorder them: a copy that comes before its
		// earlier record's is sent again once that one completed.
		for ran := 0; ran < 3; {
			select {
			case msg := <-c.sent:
				msg.Ack()
				deliver(msg)
			case msg := <-c.again:
				msg.Ack()
				deliver(msg)
			case <-time.After(guard):
				t.Fatalf("%d of the 3 messages ran", ran)
			}
			for len(h.started) > 0 {
				<-h.started
				ran++
			}
		}
		assert.Equal(t, []string{"1", "2", "3"}, h.handled["k"])
		assert.Zero(t, store.checks.Load(), "every copy ran unchecked")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), c.reg))
	})
}

// TestAParkedCopyWhoseEarlierRecordRanInAnotherInstanceGoesOn, two
// instances of one service on one table, sharing a queue: instance A
// publishes records 1 and 2 of a key; the broker gives 1 to B and 2 to A,
// where 2's first copy comes first and is parked for 1. B runs 1. While
// A's subscription keeps bringing copies sent later, 2 does not wait on
// for 1 (up to 40 times HeldWait): once copies sent HeldWait after 1 came,
// it is sent again as a checked copy, and runs.
func TestAParkedCopyWhoseEarlierRecordRanInAnotherInstanceGoesOn(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		const heldWait = 100 * time.Millisecond
		b := setup(t, backend, sqlstore.Mark)
		c := newOrderedCaseOn(t, b, nil, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		mwA, hA, regB, hB := twoInstances(t, b, c, heldWait)
		deliverA := throughDrained(t, mwA, hA)
		deliverB := through(t, regB.mw, hB)

		c.publishTogether(t, "1", "2")
		one := receiveSent(t, c.sent, "records 1 and 2")
		two := receiveSent(t, c.sent, "records 1 and 2")
		if one.Metadata["seq"] == "2" {
			one, two = two, one
		}
		require.Equal(t, []string{"1", "2"}, []string{one.Metadata["seq"], two.Metadata["seq"]})
		deliverA(two) // parked for 1
		deliverB(one)
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), regB.reg))

		// A's subscription keeps bringing first copies, of other keys,
		// published after 1.
		deadline := time.After(10 * heldWait)
		var again *message.Message
		for i := 0; again == nil; i++ {
			msg := message.NewMessage(watermill.NewUUID(), []byte("other"))
			msg.Metadata.Set("order", fmt.Sprintf("other-%d", i))
			msg.Metadata.Set("seq", "o")
			require.NoError(t, c.pub.Publish(b.topic, msg))
			deliverA(receiveSent(t, c.sent, "a message of another key"))
			select {
			case again = <-c.again:
				again.Ack()
			case <-time.After(heldWait / 4):
			case <-deadline:
				t.Fatalf("record 2 was not sent again within %v while copies kept coming", 10*heldWait)
			}
		}
		require.Equal(t, "2", again.Metadata["seq"])
		deliverA(again)
		assert.Equal(t, []string{"2"}, hA.handled["k"], "record 2 ran in A")
		assert.Equal(t, []string{"1"}, hB.handled["k"], "record 1 ran in B")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), c.reg))
	})
}

// TestAProcessThatDoesNotReceiveAnOrderedTopicReadsAndHoldsNothing, two
// services sharing a database: A publishes a topic with an order key that
// only B handles, and A's router, with ReplayPlugin, handles another topic
// only. A's Publish of a key's two messages reads no earlier record and
// holds neither (HeldWait is an hour): both are sent at once, and B runs
// them in order. Once a delivery of the topic came to A (a deploy that
// adds a handler of it there), A's publish reads the earlier records
// again, and the later message runs unchecked after the earlier one.
func TestAProcessThatDoesNotReceiveAnOrderedTopicReadsAndHoldsNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		ctx := b.ctx(t)
		store := &predecessorCounter{checkCounter: &checkCounter{Store: b.store}}
		a := newOrderedInstance(t, ctx, store, b.topic, outbox.MiddlewareConfig{Check: outbox.CheckConfig{HeldWait: time.Hour}}, watermill.NopLogger{})
		regA, mwA, pubA, sent := a.reg, a.mw, a.pub, a.sent
		a.runRouter(t, ctx, a.broker, "other", b.topic+"_other")

		publish := func(seqs ...string) { publishSeqs(t, pubA, b.topic, seqs...) }
		bySeq := func(n int, what string) map[string]*message.Message {
			t.Helper()
			got := map[string]*message.Message{}
			for range n {
				msg := receiveSent(t, sent, what)
				got[msg.Metadata["seq"]] = msg
			}
			return got
		}

		publish("1", "2")
		got := bySeq(2, "records 1 and 2, at once,")
		assert.Zero(t, store.asked.Load(), "A read no earlier record")
		regB, err := outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store, OrderKey: "order"})
		require.NoError(t, err)
		mwB, err := outbox.NewMiddleware(regB, outbox.MiddlewareConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		hB := newOrderedHandler()
		deliverB := through(t, mwB, hB)
		deliverB(got["1"])
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), regB))
		deliverB(got["2"])
		assert.Equal(t, []string{"1", "2"}, hB.handled["k"], "B ran them in order")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), regB))

		// A handles a delivery of the topic: it reads and holds again.
		hA := newOrderedHandler()
		deliverA := through(t, mwA, hA)
		publish("3")
		deliverA(receiveSent(t, sent, "record 3"))
		checked := store.checks.Load()
		publish("4", "5")
		assert.Equal(t, int64(1), store.asked.Load(), "A read the earlier record of 4")
		deliverA(receiveSent(t, sent, "record 4"))
		deliverA(receiveSent(t, sent, "record 5, once record 4 completed,"))
		assert.Equal(t, []string{"3", "4", "5"}, hA.handled["k"])
		assert.Equal(t, checked, store.checks.Load(), "4 and 5 ran unchecked")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), regA))
		assert.Zero(t, b.pendingCount(t), "nothing is left pending")
	})
}

// TestARecordPutBackInAnotherInstanceIsClaimedWhenTheEarlierCompletes,
// two instances of one service on one table, sharing a queue: B takes the
// copy of record 2 of key k, which B published, while record 1, which A
// published, is pending; B puts it back. A runs the first copy of 1,
// unchecked: its completion finds 2 waiting in the store (B's put-back is
// not A's to know), claims it and sends it again, and 2 runs in A after 1.
func TestARecordPutBackInAnotherInstanceIsClaimedWhenTheEarlierCompletes(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		ctx := b.ctx(t)
		c := newOrderedCaseOn(t, b, nil, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		mwA, err := outbox.NewMiddleware(c.reg, outbox.MiddlewareConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		hA := newOrderedHandler()
		deliverA := through(t, mwA, hA)

		c.publishTogether(t, "1")
		one := receiveSent(t, c.sent, "record 1")
		// B checks every copy; its publish of 2 is held by 1 there, and
		// put back through its sender.
		putBack := &signalLogger{msg: "Record held by an earlier record of its key, putting the copy back", hit: make(chan struct{}, 4)}
		inB := newOrderedInstance(t, ctx, b.store, b.topic, outbox.MiddlewareConfig{Check: outbox.CheckConfig{FirstCopies: true, HeldWait: time.Millisecond, HeldResendAfter: time.Hour}}, putBack)
		regB := inB.reg
		runResubmitter(t, ctx, regB, inB.broker, outbox.StaleResubmitterConfig{OlderThan: time.Hour})
		publishSeqs(t, inB.pub, b.topic, "2")
		hB := newOrderedHandler()
		through(t, inB.mw, hB)(receiveSent(t, inB.sent, "record 2"))
		select {
		case <-putBack.hit:
		default:
			t.Fatal("B did not put record 2 back for record 1")
		}
		assert.Empty(t, hB.handled["k"], "record 2 did not run in B")
		// B's ask to send record 1 again (its copy may be lost) is over
		// before 1 completes: it would claim 2 in B instead.
		require.NoError(t, regB.WaitCompletions(ctx))

		deliverA(one)
		deliverA(receiveSent(t, c.again, "record 2, claimed once record 1 completed in A,"))
		assert.Equal(t, []string{"1", "2"}, hA.handled["k"], "handled in the order saved")
		require.NoError(t, outbox.WaitBackgroundCompletions(context.Background(), c.reg))
		assert.Zero(t, b.pendingCount(t))
	})
}

// TestASecondRouterThatReceivesTheTopicTurnsItsFirstCopiesBackOn, one
// process with two routers on one registry, as a deploy that adds a
// consumer of the topic to a process that only published it: the first
// router (ReplayPlugin, a handler of another topic) starts, and the
// process publishes records 1 and 2 of a key without reading an earlier
// record. A second router whose handler subscribes to the topic starts,
// before any delivery of it comes: the next Publish reads the earlier
// record of its key again.
func TestASecondRouterThatReceivesTheTopicTurnsItsFirstCopiesBackOn(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		ctx := b.ctx(t)
		store := &predecessorCounter{checkCounter: &checkCounter{Store: b.store}}
		a := newOrderedInstance(t, ctx, store, b.topic, outbox.MiddlewareConfig{}, watermill.NopLogger{})
		a.runRouter(t, ctx, a.broker, "other", b.topic+"_other")
		publishSeqs(t, a.pub, b.topic, "1", "2")
		assert.Zero(t, store.asked.Load(), "no earlier record read while no handler here receives the topic")

		// Its handler reads another GoChannel, which the replay of 1 and 2
		// does not reach: no delivery comes here.
		other := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		t.Cleanup(func() { _ = other.Close() })
		a.runRouter(t, ctx, other, "orders-handler", b.topic)
		publishSeqs(t, a.pub, b.topic, "3")
		assert.Equal(t, int64(1), store.asked.Load(), "the earlier record of 3 read once a handler here receives the topic")
	})
}
