package outbox_test

import (
	"context"
	"errors"
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
	"github.com/wmoutbox/outbox/sqlstore"
)

// refusingBroker refuses publishes, as a broker that is down does, until it
// is told to accept, or until it has refused limit of them; each refusal is
// reported on refused.
type refusingBroker struct {
	message.Publisher
	mu       sync.Mutex
	limit    int
	refusals int
	accepts  bool
	refused  chan int // the number of refusals so far, after each
}

var errBrokerDown = errors.New("broker refuses the publish")

func (r *refusingBroker) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	if !r.accepts && r.refusals < r.limit {
		r.refusals++
		n := r.refusals
		r.mu.Unlock()
		r.refused <- n
		return errBrokerDown
	}
	r.mu.Unlock()
	return r.Publisher.Publish(topic, msgs...)
}

func (r *refusingBroker) accept() {
	r.mu.Lock()
	r.accepts = true
	r.mu.Unlock()
}

// shipment is the topology of issue 21: handler "ship" on tracked topic in
// returns lines messages for tracked topic out, through the router's
// publisher decorator, into a broker that refuses the first publishes;
// handler "sink" on out counts what it handles by record id.
type shipment struct {
	b        *bundle
	in, out  string
	gc       *gochannel.GoChannel
	broker   *refusingBroker
	runs     atomic.Int64
	sinkMu   sync.Mutex
	sunk     map[int64]int    // out record id: times handled
	sunkUUID map[int64]string // out record id: the UUID handled
	sinkDone chan struct{}
	lines    int
	// abandoned is signalled by OnAbandon; completed when the in record
	// is completed.
	abandoned chan *outbox.AbandonedError
	completed chan struct{}
	router    *message.Router
	runErr    chan error
}

const shipmentMaxAttempts = 5

func newShipment(t *testing.T, backend testenv.Backend, lines, refusals int) *shipment {
	t.Helper()
	db := backend.Open(t)
	store := testenv.NewStore(t, backend, db, sqlstore.Mark)
	s := &shipment{in: "in_" + store.Table(), out: "out_" + store.Table(), lines: lines,
		sunk: map[int64]int{}, sunkUUID: map[int64]string{}, sinkDone: make(chan struct{}),
		abandoned: make(chan *outbox.AbandonedError, 1), completed: make(chan struct{}), runErr: make(chan error, 1)}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: s.in, Store: store}, outbox.Tracked{Topic: s.out, Store: store})
	require.NoError(t, err)
	s.b = &bundle{backend: backend, db: db, store: store, reg: reg, topic: s.in, logger: &testenv.CaptureLogger{}}
	reg.SetObserver(&completionSignal{tally: newTally(), topic: s.in, consumer: "ship", done: s.completed})

	s.gc = gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = s.gc.Close() })
	s.broker = &refusingBroker{Publisher: s.gc, limit: refusals, refused: make(chan int, refusals)}

	s.router, err = message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{
		MaxAttempts: shipmentMaxAttempts,
		Backoff:     outbox.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
		OnAbandon:   func(_ *message.Message, aerr *outbox.AbandonedError) { s.abandoned <- aerr },
	}, s.b.logger)
	require.NoError(t, err)
	s.router.AddMiddleware(mw)
	s.router.AddPublisherDecorators(outbox.PublisherDecorator(reg))
	s.router.AddHandler("ship", s.in, s.gc, s.out, s.broker, func(msg *message.Message) ([]*message.Message, error) {
		s.runs.Add(1)
		// Each run makes new messages, with new UUIDs, as a real handler
		// does.
		produced := make([]*message.Message, lines)
		for i := range produced {
			produced[i] = message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "%s line %d", msg.Payload, i))
		}
		return produced, nil
	})
	s.router.AddNoPublisherHandler("sink", s.out, s.gc, func(msg *message.Message) error {
		ref, ok := outbox.RecordFromContext(msg.Context())
		if !ok {
			return errors.New("sink: an out message without its record")
		}
		s.sinkMu.Lock()
		defer s.sinkMu.Unlock()
		s.sunk[ref.ID]++
		s.sunkUUID[ref.ID] = msg.UUID
		if len(s.sunk) == s.lines && s.sunk[ref.ID] == 1 {
			close(s.sinkDone)
		}
		return nil
	})
	go func() { s.runErr <- s.router.Run(context.Background()) }()
	<-s.router.Running()
	t.Cleanup(func() {
		_ = s.router.Close()
		<-s.runErr
	})
	return s
}

// completionSignal is a tally that also closes done when a delivery of
// topic is completed for consumer.
type completionSignal struct {
	*tally
	topic, consumer string
	once            sync.Once
	done            chan struct{}
}

func (c *completionSignal) Completed(topic, consumer string) {
	c.tally.Completed(topic, consumer)
	if topic == c.topic && consumer == c.consumer {
		c.once.Do(func() { close(c.done) })
	}
}

// order publishes one tracked order on in and returns its record id.
func (s *shipment) order(t *testing.T) int64 {
	t.Helper()
	pub, err := outbox.NewPublisher(s.b.reg, s.gc)
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), []byte("order-1"))
	require.NoError(t, pub.Publish(s.in, msg))
	return idOf(t, msg)
}

// outRecords reads the out records: id to UUID.
func (s *shipment) outRecords(t *testing.T) map[int64]string {
	t.Helper()
	var rows []struct {
		ID   int64  `db:"id"`
		UUID string `db:"uuid"`
	}
	q := s.b.db.Rebind("SELECT id, uuid FROM " + s.b.store.Table() + " WHERE topic = ?")
	require.NoError(t, s.b.db.SelectContext(s.b.ctx(t), &rows, q, s.out))
	out := make(map[int64]string, len(rows))
	for _, r := range rows {
		out[r.ID] = r.UUID
	}
	return out
}

// waitSink waits until the sink handled every produced position.
func (s *shipment) waitSink(t *testing.T) {
	t.Helper()
	select {
	case <-s.sinkDone:
	case <-s.b.ctx(t).Done():
		s.sinkMu.Lock()
		defer s.sinkMu.Unlock()
		t.Fatalf("the sink handled %d of %d produced messages", len(s.sunk), s.lines)
	}
}

// requireEachHandledOnce checks that the sink handled each out record once,
// as it is stored, and nothing else.
func (s *shipment) requireEachHandledOnce(t *testing.T) {
	t.Helper()
	records := s.outRecords(t)
	require.Len(t, records, s.lines, "exactly one out record per produced position")
	s.sinkMu.Lock()
	defer s.sinkMu.Unlock()
	for id := range records {
		assert.Equal(t, 1, s.sunk[id], "out record %d is handled once", id)
	}
	assert.Equal(t, records, s.sunkUUID, "the sink got each stored record, with its stored UUID")
}

// TestProducedMessagesWhenTheBrokerRefuses is issue 21's topology: handler
// "ship" on tracked topic in returns one message (or three, the 3-line
// shipment) for tracked topic out through
// router.AddPublisherDecorators(outbox.PublisherDecorator(reg)), and the
// broker refuses the publishes of out. Each refused publish counts as a
// failed attempt of the in delivery, so the backoff and MaxAttempts apply;
// each rerun reuses the out records the first run saved, so the sink
// handles every produced position once.
func TestProducedMessagesWhenTheBrokerRefuses(t *testing.T) {
	t.Parallel()
	for _, lines := range []int{1, 3} {
		t.Run(fmt.Sprintf("%dLines", lines), func(t *testing.T) {
			t.Parallel()

			t.Run("RecoversBeforeMaxAttempts", func(t *testing.T) {
				t.Parallel()
				forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
					const refusals = 3
					s := newShipment(t, backend, lines, refusals)
					inID := s.order(t)
					s.waitSink(t)
					select {
					case <-s.completed:
					case <-s.b.ctx(t).Done():
						t.Fatal("the in record was not completed")
					}

					assert.EqualValues(t, refusals+1, s.runs.Load(), "one run per refused publish, and the one that went through")
					attempts, lastErr := s.b.attemptsOf(t, inID)
					assert.Equal(t, refusals, attempts, "each refused publish is a failed attempt of the in delivery")
					assert.Contains(t, lastErr, errBrokerDown.Error())
					assert.ErrorIs(t, s.b.store.CheckPending(s.b.ctx(t), s.b.delivery(inID)), outbox.ErrNotPending, "the in record is completed")
					s.requireEachHandledOnce(t)
				})
			})

			t.Run("AbandonedAfterMaxAttempts", func(t *testing.T) {
				t.Parallel()
				forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
					// More refusals than attempts: the broker is down for
					// longer than the delivery may try.
					const refusals = 4 * shipmentMaxAttempts
					s := newShipment(t, backend, lines, refusals)
					inID := s.order(t)
					select {
					case aerr := <-s.abandoned:
						assert.Equal(t, inID, aerr.ID)
						assert.Equal(t, shipmentMaxAttempts, aerr.Attempts)
						assert.ErrorIs(t, aerr, errBrokerDown)
					case <-waitRefusals(s.broker, refusals):
						t.Fatalf("the broker refused %d publishes and the in record was never abandoned (%d runs)", refusals, s.runs.Load())
					case <-s.b.ctx(t).Done():
						t.Fatal("the in record was not abandoned")
					}
					assert.EqualValues(t, shipmentMaxAttempts, s.runs.Load(), "the handler ran MaxAttempts times while the broker refused")
					attempts, _ := s.b.attemptsOf(t, inID)
					assert.Equal(t, shipmentMaxAttempts, attempts)
					require.Len(t, s.outRecords(t), lines, "the reruns saved no second set of out records")

					// The broker is back; the out records the failed runs
					// saved are pending, and a replay delivers each once.
					s.broker.accept()
					_, err := outbox.Replay(s.b.ctx(t), s.b.reg, s.gc, outbox.ReplayConfig{}, nil)
					require.NoError(t, err)
					s.waitSink(t)
					s.requireEachHandledOnce(t)
					assert.EqualValues(t, shipmentMaxAttempts, s.runs.Load(), "the abandoned in record is not handled again")
				})
			})
		})
	}
}

// waitRefusals is closed once the broker has refused n publishes.
func waitRefusals(r *refusingBroker, n int) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for got := range r.refused {
			if got == n {
				close(done)
				return
			}
		}
	}()
	return done
}

// TestNackAfterProducingCountsAnAttempt: a handler that produced messages
// for a publisher without the decorator (here: an untracked topic) learns of
// the failed publish only from the router's nack, which counts as a failed
// attempt too, and abandons after MaxAttempts.
func TestNackAfterProducingCountsAnAttempt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		msg := b.publishTracked(t, 1)[0]
		id := idOf(t, msg)
		abandoned := make(chan *outbox.AbandonedError, 1)
		mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{MaxAttempts: 1,
			OnAbandon: func(_ *message.Message, aerr *outbox.AbandonedError) { abandoned <- aerr }}, b.logger)
		require.NoError(t, err)
		produce := mw(func(*message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("audit line"))}, nil
		})

		delivered := msg.Copy()
		produced, err := produce(delivered)
		require.NoError(t, err)
		require.Len(t, produced, 1)
		delivered.Nack() // as the router does when publishing them failed
		select {
		case aerr := <-abandoned:
			assert.Equal(t, id, aerr.ID)
			assert.Equal(t, 1, aerr.Attempts)
		case <-b.ctx(t).Done():
			t.Fatal("the nack was not counted")
		}
		attempts, lastErr := b.attemptsOf(t, id)
		assert.Equal(t, 1, attempts)
		assert.Contains(t, lastErr, "publishing the produced messages")
		assert.ErrorIs(t, b.store.CheckPending(b.ctx(t), b.delivery(id)), outbox.ErrNotPending, "abandoned")
	})
}
