package outbox_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/sqlstore"
)

// discardPublisher is a publisher that does nothing, so that what is measured
// is the decorator alone.
type discardPublisher struct{}

func (discardPublisher) Publish(string, ...*message.Message) error { return nil }
func (discardPublisher) Close() error                              { return nil }

func untrackedFixture(t testing.TB) (message.Publisher, message.HandlerFunc, *message.Message, *outbox.Registry) {
	store, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite()}) // never reached
	require.NoError(t, err)
	reg, err := outbox.NewRegistry(
		outbox.Tracked{Topic: "orders", Store: store},
		outbox.Tracked{Topic: "payments", Store: store},
	)
	require.NoError(t, err)
	require.True(t, reg.Enabled())
	pub, err := outbox.NewPublisher(reg, discardPublisher{})
	require.NoError(t, err)
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	require.NoError(t, err)
	h := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msg := message.NewMessage("uuid", []byte("payload"))
	msg.Metadata.Set("trace", "x")
	return pub, h, msg, reg
}

func TestUntrackedAllocatesNothing(t *testing.T) {
	pub, h, msg, reg := untrackedFixture(t)
	// The variadic slice is built once: it is the caller's allocation, not
	// the decorator's, and a raw publisher call costs it too.
	msgs := []*message.Message{msg}
	tr := &recordingTracer{}
	for _, tracer := range []observe.Tracer{nil, tr} {
		reg.SetTracer(tracer)
		if n := testing.AllocsPerRun(1000, func() { _ = pub.Publish("audit", msgs...) }); n != 0 {
			t.Errorf("untracked publish allocates %v times per call (tracer %T)", n, tracer)
		}
		if n := testing.AllocsPerRun(1000, func() { _, _ = h(msg) }); n != 0 {
			t.Errorf("untracked delivery allocates %v times per call (tracer %T)", n, tracer)
		}
	}
	if steps := tr.snapshot(); len(steps) != 0 {
		t.Errorf("the tracer was told of untracked messages: %q", steps)
	}
}

func BenchmarkUntrackedPublish(b *testing.B) {
	pub, _, msg, _ := untrackedFixture(b)
	msgs := []*message.Message{msg}
	b.ReportAllocs()
	for b.Loop() {
		_ = pub.Publish("audit", msgs...)
	}
}

func BenchmarkUntrackedDelivery(b *testing.B) {
	_, h, msg, _ := untrackedFixture(b)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = h(msg)
	}
}
