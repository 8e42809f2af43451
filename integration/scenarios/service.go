package scenarios

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
)

// delivery is one message as the router delivered it, reported once the
// outbox middleware returned, that is once the record was completed or left
// pending.
type delivery struct {
	// Handler is the name of the handler (the consumer) it was delivered
	// to.
	Handler string
	Topic   string
	UUID    string
	// Received is the metadata the subscriber delivered, before the outbox
	// middleware read it.
	Received message.Metadata
	// Ran tells whether the handler ran; Seen, Payload and Record are what it
	// was given.
	Ran     bool
	Seen    message.Metadata
	Payload string
	Record  outbox.RecordRef
	Tracked bool
	// Err is what the middleware chain returned: nil acks, non-nil nacks.
	Err error
}

type deliveryKey struct{}

// outcome decides what the handler returns for a message on its n-th run
// (counting from 1).
type outcome func(msg *message.Message, run int) error

func succeed(*message.Message, int) error { return nil }

// service is a router as a user's service has it, with the outbox adopted:
// the middleware, the replay plugin, and a handler per topic that reports
// every delivery.
type service struct {
	t          *testing.T
	router     *message.Router
	deliveries chan delivery
	// history is what waitEach read from deliveries.
	history  []delivery
	stopping chan struct{}
	done     chan struct{} // closed when Run returned runErr
	runErr   error
	// reg is the registry whose background completions stop waits for;
	// nil for a service without the outbox.
	reg *outbox.Registry

	mu   sync.Mutex
	runs map[runKey]int // handler runs by handler and message UUID
}

// runKey names the runs of one handler for one message.
type runKey struct{ handler, uuid string }

// receiver is one handler of a service: its name (the consumer), the topic
// it subscribes to and the subscriber it reads from.
type receiver struct {
	name  string
	topic string
	sub   message.Subscriber
}

// serviceConfig is a service with handlers of its own choosing.
type serviceConfig struct {
	reg *outbox.Registry
	// pub is the raw publisher replay sends through.
	pub       message.Publisher
	receivers []receiver
	decide    outcome
	// logger is the outbox middleware's; nil logs nothing.
	logger watermill.LoggerAdapter
	// mw configures the outbox middleware (an inbox, a confirmation
	// publisher); the zero value is the defaults.
	mw outbox.MiddlewareConfig
	// confirmations, when set, is the subscriber of the handler that
	// completes remote consumers' deliveries from their confirmations.
	confirmations message.Subscriber
	// plain leaves the outbox out of the router: a receiver that does not
	// run the plugin.
	plain bool
	// replay configures the replay plugin; the zero value is the defaults.
	replay outbox.ReplayConfig
	// noReplay leaves the replay plugin out: a start that sends nothing
	// again, so that only what the broker kept reaches the service.
	noReplay bool
}

// startService starts a service on a fresh publisher and subscriber of the
// group (a new process), with one handler per topic, and waits until it is
// running, that is once replay has sent every pending record.
func (e *env) startService(decide outcome, topics ...string) *service {
	e.t.Helper()
	pub, sub := e.connect()
	cfg := serviceConfig{reg: e.reg, pub: pub, decide: decide}
	for _, topic := range topics {
		cfg.receivers = append(cfg.receivers, receiver{name: "handle_" + topic, topic: topic, sub: sub})
	}
	return e.startServiceWith(cfg)
}

// startServiceWith starts a service as cfg says and waits until it is
// running.
func (e *env) startServiceWith(cfg serviceConfig) *service {
	e.t.Helper()
	s := &service{
		t: e.t, deliveries: make(chan delivery, 512), stopping: make(chan struct{}), done: make(chan struct{}),
		runs: map[runKey]int{},
	}

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(e.t, err)
	router.AddMiddleware(s.observe)
	if !cfg.plain {
		mw, err := outbox.NewMiddleware(cfg.reg, cfg.mw, cfg.logger)
		require.NoError(e.t, err)
		router.AddMiddleware(mw)
		if !cfg.noReplay {
			router.AddPlugin(outbox.ReplayPlugin(cfg.reg, cfg.pub, cfg.replay, nil))
		}
	}
	if cfg.confirmations != nil {
		require.NoError(e.t, outbox.AddConfirmationHandler(router, cfg.reg, cfg.confirmations, cfg.logger))
	}
	for _, r := range cfg.receivers {
		router.AddNoPublisherHandler(r.name, r.topic, r.sub, s.handler(cfg.decide))
	}
	s.router = router
	if !cfg.plain {
		s.reg = cfg.reg
	}

	go func() {
		s.runErr = router.Run(context.Background())
		close(s.done)
	}()
	select {
	case <-router.Running():
	case <-s.done:
		e.t.Fatalf("router did not start: %v", s.runErr)
	case <-e.ctx().Done():
		e.t.Fatal("router did not start in time")
	}
	e.t.Cleanup(s.stop)
	return s
}

// observe is the outermost middleware: it records what the subscriber
// delivered and what the chain inside, the outbox middleware first,
// returned.
func (s *service) observe(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		d := &delivery{
			Handler: message.HandlerNameFromCtx(ctx), Topic: message.SubscribeTopicFromCtx(ctx),
			UUID: msg.UUID, Received: copyMetadata(msg.Metadata),
		}
		msg.SetContext(context.WithValue(msg.Context(), deliveryKey{}, d))
		produced, err := h(msg)
		d.Err = err
		select {
		case s.deliveries <- *d:
		case <-s.stopping: // the test is over; nobody reads any more
		}
		return produced, err
	}
}

func (s *service) handler(decide outcome) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		key := runKey{message.HandlerNameFromCtx(msg.Context()), msg.UUID}
		s.mu.Lock()
		s.runs[key]++
		n := s.runs[key]
		s.mu.Unlock()
		if d, ok := msg.Context().Value(deliveryKey{}).(*delivery); ok {
			d.Ran = true
			d.Seen = copyMetadata(msg.Metadata)
			d.Payload = string(msg.Payload)
			d.Record, d.Tracked = outbox.RecordFromContext(msg.Context())
		}
		return decide(msg, n)
	}
}

// next waits for the next delivery.
func (s *service) next() delivery {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	select {
	case d := <-s.deliveries:
		return d
	case <-s.done:
		s.t.Fatalf("router stopped while waiting for a delivery: %v", s.runErr)
	case <-ctx.Done():
		s.t.Fatal("no delivery within the timeout")
	}
	return delivery{}
}

// handledOnce waits until the handler succeeded for every UUID, and returns
// those deliveries by UUID. Deliveries the handler did not run for (copies of
// completed records) are skipped.
func (s *service) handledOnce(uuids ...string) map[string]delivery {
	s.t.Helper()
	want := map[string]bool{}
	for _, u := range uuids {
		want[u] = true
	}
	got := map[string]delivery{}
	for len(got) < len(want) {
		d := s.next()
		if !d.Ran || d.Err != nil {
			continue
		}
		require.True(s.t, want[d.UUID], "handled unexpected message %s", d.UUID)
		_, again := got[d.UUID]
		require.False(s.t, again, "message %s handled twice", d.UUID)
		got[d.UUID] = d
	}
	return got
}

// handledByEach waits until every handler succeeded for every message, and
// returns the first such delivery of each. Deliveries of other messages, and
// further runs, are left to the run counts.
func (s *service) handledByEach(handlers, uuids []string) map[runKey]delivery {
	s.t.Helper()
	return s.waitEach("handle", handlers, uuids, func(d delivery) bool { return d.Ran && d.Err == nil })
}

// skippedByEach waits until every handler acked a copy of every message
// without running.
func (s *service) skippedByEach(handlers, uuids []string) map[runKey]delivery {
	s.t.Helper()
	return s.waitEach("skip", handlers, uuids, func(d delivery) bool { return !d.Ran && d.Err == nil })
}

// waitEach waits until every handler had a delivery of every message that
// matches, and returns the first of each. It looks at the deliveries that
// earlier waits read too, so that waits for different handlers can follow
// one another.
func (s *service) waitEach(what string, handlers, uuids []string, match func(delivery) bool) map[runKey]delivery {
	s.t.Helper()
	want := map[runKey]bool{}
	for _, h := range handlers {
		for _, u := range uuids {
			want[runKey{h, u}] = true
		}
	}
	got := map[runKey]delivery{}
	take := func(d delivery) {
		k := runKey{d.Handler, d.UUID}
		if _, seen := got[k]; want[k] && !seen && match(d) {
			got[k] = d
		}
	}
	for _, d := range s.history {
		take(d)
	}
	timeout := time.NewTimer(waitTimeout)
	defer timeout.Stop()
	for len(got) < len(want) {
		select {
		case d := <-s.deliveries:
			s.history = append(s.history, d)
			take(d)
		case <-s.done:
			s.t.Fatalf("router stopped while waiting for deliveries: %v", s.runErr)
		case <-timeout.C:
			missing := map[string]int{}
			for k := range want {
				if _, ok := got[k]; !ok {
					missing[k.handler]++
				}
			}
			s.t.Fatalf("within %v, these handlers did not %s this many of the %d messages: %v", waitTimeout, what, len(uuids), missing)
		}
	}
	return got
}

// totalRuns returns how many times the handlers ran.
func (s *service) totalRuns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.runs {
		n += c
	}
	return n
}

// runCount returns how many times the handlers ran for a message.
func (s *service) runCount(uuid string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, c := range s.runs {
		if k.uuid == uuid {
			n += c
		}
	}
	return n
}

// runsOf returns how many times a handler ran for a message.
func (s *service) runsOf(handler, uuid string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[runKey{handler, uuid}]
}

// assertRanOnce asserts the handler ran exactly once for each message.
func (s *service) assertRanOnce(uuids ...string) {
	s.t.Helper()
	for _, u := range uuids {
		assert.Equal(s.t, 1, s.runCount(u), "handler runs for %s", u)
	}
}

// stop closes the router and requires a clean shutdown.
func (s *service) stop() {
	select {
	case <-s.stopping:
		return
	default:
	}
	close(s.stopping)
	require.NoError(s.t, s.router.Close())
	<-s.done
	require.NoError(s.t, s.runErr)
	if s.reg != nil {
		// The completions that follow the last acknowledgements.
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		require.NoError(s.t, s.reg.WaitCompletions(ctx))
	}
}

func copyMetadata(md message.Metadata) message.Metadata {
	out := make(message.Metadata, len(md))
	for k, v := range md {
		out[k] = v
	}
	return out
}
