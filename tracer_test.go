package outbox_test

import (
	"context"
	"fmt"
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
	"github.com/wmoutbox/outbox/sqlstore"
)

// stepKey is the context key a recordingTracer marks contexts with.
type stepKey struct{}

// recordingTracer writes down each step the outbox reports, and marks the
// metadata and the contexts it hands back, so that a test sees where they
// went.
type recordingTracer struct {
	mu    sync.Mutex
	steps []string
}

func (r *recordingTracer) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps = append(r.steps, fmt.Sprintf(format, args...))
}

func (r *recordingTracer) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.steps...)
}

func (r *recordingTracer) TracePublish(topic string, msgs []*message.Message, inTx bool) func(error) {
	saved := make([]context.Context, len(msgs))
	for i, msg := range msgs {
		msg.Metadata.Set("x-trace", "publish")
		saved[i] = msg.Context()
		msg.SetContext(context.WithValue(msg.Context(), stepKey{}, "publish"))
	}
	r.add("publish tx=%v", inTx)
	return func(err error) {
		for i, msg := range msgs {
			msg.SetContext(saved[i])
		}
		r.add("publish end id=%v err=%T", msgs[0].Metadata.Get(outbox.MetadataID) != "", err)
	}
}

func (r *recordingTracer) TraceResend(kind observe.ResendKind, _ string, msgs []*message.Message) func(error) {
	r.add("resend %s saved=%s", kind, msgs[0].Metadata.Get("x-trace"))
	for _, msg := range msgs {
		msg.Metadata.Set("x-trace", "resend")
	}
	return func(err error) { r.add("resend end err=%v", err) }
}

func (r *recordingTracer) TraceDelivery(ctx context.Context, msg *message.Message, ref outbox.RecordRef) context.Context {
	r.add("delivery trace=%s consumer=%q", msg.Metadata.Get("x-trace"), ref.Consumer)
	return context.WithValue(ctx, stepKey{}, "delivery")
}

func (r *recordingTracer) TraceCheck(ctx context.Context, _ outbox.RecordRef) (context.Context, func(observe.CheckOutcome, error)) {
	r.add("check in=%v", ctx.Value(stepKey{}))
	return ctx, func(o observe.CheckOutcome, err error) { r.add("check end %s err=%v", o, err) }
}

func (r *recordingTracer) TraceComplete(ctx context.Context, _ outbox.RecordRef) (context.Context, func(error)) {
	r.add("complete in=%v", ctx.Value(stepKey{}))
	return ctx, func(err error) { r.add("complete end err=%v", err) }
}

// contextPublisher keeps what the messages' contexts held when they were
// sent.
type contextPublisher struct {
	message.Publisher
	mu   sync.Mutex
	seen []any
}

func (p *contextPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	for _, msg := range msgs {
		p.seen = append(p.seen, msg.Context().Value(stepKey{}))
	}
	p.mu.Unlock()
	return p.Publisher.Publish(topic, msgs...)
}

func sqliteBackend(t *testing.T) testenv.Backend {
	t.Helper()
	for _, b := range testenv.Backends() {
		if b.Name == "SQLite" {
			return b
		}
	}
	t.Fatal("no SQLite backend")
	return testenv.Backend{}
}

// The tracer hooks need no particular database; they run on SQLite.
func TestTracerSeesEveryTrackedStep(t *testing.T) {
	t.Parallel()

	t.Run("PublishReplayCheckComplete", func(t *testing.T) {
		t.Parallel()
		b := setup(t, sqliteBackend(t), sqlstore.Mark)
		tr := &recordingTracer{}
		b.reg.SetTracer(tr)

		sent := &contextPublisher{Publisher: failingPublisher{}}
		pub, err := outbox.NewPublisher(b.reg, sent)
		require.NoError(t, err)
		msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
		require.Error(t, pub.Publish(b.topic, msg), "the broker is down: the record stays pending")
		assert.Equal(t, []any{"publish"}, sent.seen, "the send ran in the context the tracer gave")
		assert.Nil(t, msg.Context().Value(stepKey{}), "and the caller's context is back")
		recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, 10)
		require.NoError(t, err)
		require.Len(t, recs, 1)
		assert.Equal(t, "publish", recs[0].Metadata["x-trace"], "the tracer's metadata was saved with the record")

		gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 2}, watermill.NopLogger{})
		t.Cleanup(func() { _ = gc.Close() })
		sub, err := gc.Subscribe(b.ctx(t), b.topic)
		require.NoError(t, err)
		_, err = outbox.Replay(b.ctx(t), b.reg, gc, outbox.ReplayConfig{}, nil)
		require.NoError(t, err)
		got := <-sub
		got.Ack()
		assert.Equal(t, "resend", got.Metadata.Get("x-trace"), "the resend's metadata was sent")

		var handlerSaw any
		h := b.middleware(t)(func(msg *message.Message) ([]*message.Message, error) {
			handlerSaw = msg.Context().Value(stepKey{})
			return nil, nil
		})
		_, err = h(got.Copy())
		require.NoError(t, err)
		assert.Equal(t, "delivery", handlerSaw, "the handler runs in the delivery's context")
		_, err = h(got.Copy())
		require.NoError(t, err)

		assert.Equal(t, []string{
			"publish tx=false",
			"publish end id=true err=*outbox.SendError",
			"resend replay saved=publish",
			"resend end err=<nil>",
			`delivery trace=resend consumer=""`,
			"check in=delivery",
			"check end pending err=<nil>",
			"complete in=delivery",
			"complete end err=<nil>",
			`delivery trace=resend consumer=""`,
			"check in=delivery",
			"check end duplicate err=<nil>",
		}, tr.snapshot())
	})

	t.Run("TxPublishAndResubmit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, sqliteBackend(t), sqlstore.Mark)
		tr := &recordingTracer{}
		b.reg.SetTracer(tr)
		gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
		t.Cleanup(func() { _ = gc.Close() })
		txPub, err := outbox.NewTxPublisher(b.reg, gc)
		require.NoError(t, err)

		tx, err := b.db.BeginTxx(b.ctx(t), nil)
		require.NoError(t, err)
		ptx := txPub.Wrap(tx)
		require.NoError(t, ptx.Publish(b.ctx(t), b.topic, message.NewMessage(watermill.NewUUID(), nil)))
		require.NoError(t, ptx.Commit())
		recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, 10)
		require.NoError(t, err)
		require.Len(t, recs, 1)
		assert.Equal(t, "publish", recs[0].Metadata["x-trace"], "the tracer's metadata was saved in the transaction")

		b.backdate(t, "created_at", 0)
		b.backdate(t, "last_sent_at", 0)
		rs, err := outbox.NewStaleResubmitter(b.reg, gc, outbox.StaleResubmitterConfig{}, nil)
		require.NoError(t, err)
		res, err := rs.ResubmitOnce(b.ctx(t))
		require.NoError(t, err)
		require.Equal(t, 1, res.Total())
		assert.Equal(t, []string{
			"publish tx=true",
			"publish end id=true err=<nil>",
			"resend resubmit saved=publish",
			"resend end err=<nil>",
		}, tr.snapshot())
	})

}
