package outbox

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// ReplayConfig configures [Replay] and [ReplayPlugin].
type ReplayConfig struct {
	// PageSize is how many pending records are read per query; replay holds
	// at most three pages in memory (the one being sent, the next one, and
	// the one being read), whatever the backlog. Defaults to 500.
	PageSize int
}

func (c *ReplayConfig) setDefaults() {
	if c.PageSize == 0 {
		c.PageSize = 500
	}
}

// Validate reports a configuration error, if any.
func (c ReplayConfig) Validate() error {
	if c.PageSize < 1 {
		return fmt.Errorf("%w: PageSize %d must be positive", ErrInvalidConfig, c.PageSize)
	}
	return nil
}

// ReplayResult counts the records [Replay] republished, per tracked name.
type ReplayResult map[string]int

// Total is the number of records replayed across names.
func (r ReplayResult) Total() int {
	n := 0
	for _, c := range r {
		n += c
	}
	return n
}

// Replay republishes every pending record of every tracked name through pub,
// which must be the undecorated publisher, with the record's id, UUID,
// payload and metadata. It reads each name's records in pages ordered by id
// and stops at the first record it cannot read or send, returning a
// [*ReplayError] that names it.
//
// Call it only once the subscriptions that receive the messages exist: a
// broker without persistence (GoChannel), an unbound AMQP queue or a new
// consumer group loses what is sent before. [ReplayPlugin] does that for a
// router.
func Replay(ctx context.Context, reg *Registry, pub message.Publisher, cfg ReplayConfig, logger watermill.LoggerAdapter) (ReplayResult, error) {
	r, err := newReplayer(reg, pub, cfg, logger)
	if err != nil {
		return nil, err
	}
	return r.run(ctx)
}

type replayer struct {
	reg    *Registry
	pub    message.Publisher
	cfg    ReplayConfig
	logger watermill.LoggerAdapter
}

func newReplayer(reg *Registry, pub message.Publisher, cfg ReplayConfig, logger watermill.LoggerAdapter) (*replayer, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: replay publisher is nil", ErrInvalidConfig)
	}
	if _, decorated := pub.(*publisher); decorated {
		return nil, fmt.Errorf("%w: replay needs the undecorated publisher, it would save every record again", ErrInvalidConfig)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &replayer{reg: reg, pub: pub, cfg: cfg, logger: logger}, nil
}

func (r *replayer) run(ctx context.Context) (ReplayResult, error) {
	result := ReplayResult{}
	if !r.reg.enabled {
		return result, nil
	}
	for _, name := range r.reg.names {
		n, err := r.replayName(ctx, name, r.reg.byName[name])
		result[name] = n
		if err != nil {
			r.logger.Error("Replay aborted", err, watermill.LogFields{"outbox_name": name, "replayed": n})
			return result, err
		}
		r.logger.Info("Replayed pending records", watermill.LogFields{"outbox_name": name, "replayed": n})
	}
	return result, nil
}

// page is one read of pending records, handed from the reader to the sender.
type page struct {
	records []Record
	err     error
}

// replayName streams the pending records of one name: a reader goroutine
// fetches the next page while the current one is sent, through a channel of
// one page, so memory stays at three pages whatever the backlog.
func (r *replayer) replayName(ctx context.Context, name string, store Store) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pages := make(chan page, 1)
	go func() {
		defer close(pages)
		var after int64
		for {
			recs, err := store.PendingAfter(ctx, name, after, r.cfg.PageSize)
			if err != nil {
				select {
				case pages <- page{err: err}:
				case <-ctx.Done():
				}
				return
			}
			if len(recs) == 0 {
				return
			}
			select {
			case pages <- page{records: recs}:
			case <-ctx.Done():
				return
			}
			if len(recs) < r.cfg.PageSize {
				return
			}
			after = recs[len(recs)-1].ID
		}
	}()

	sent := 0
	var lastID int64
	for p := range pages {
		if p.err != nil {
			return sent, &ReplayError{Name: name, AfterID: lastID, Err: p.err}
		}
		msgs := make([]*message.Message, len(p.records))
		for i, rec := range p.records {
			msgs[i] = replayMessage(ctx, name, rec)
		}
		if err := r.pub.Publish(name, msgs...); err != nil {
			return sent, &ReplayError{Name: name, ID: p.records[0].ID, Err: fmt.Errorf("sending records %d..%d: %w", p.records[0].ID, p.records[len(p.records)-1].ID, err)}
		}
		sent += len(msgs)
		lastID = p.records[len(p.records)-1].ID
	}
	if err := ctx.Err(); err != nil {
		return sent, &ReplayError{Name: name, AfterID: lastID, Err: err}
	}
	return sent, nil
}

func replayMessage(ctx context.Context, name string, rec Record) *message.Message {
	md := make(message.Metadata, len(rec.Metadata)+2)
	for k, v := range rec.Metadata {
		md[k] = v
	}
	md[MetadataID] = strconv.FormatInt(rec.ID, 10)
	md[MetadataName] = name
	msg := message.NewMessage(rec.UUID, rec.Payload)
	msg.Metadata = md
	msg.SetContext(ctx)
	return msg
}

// ReplayPlugin returns a router plugin that runs [Replay] as part of starting
// the router, once every handler's subscription is open and before
// Router.Running is closed. pub must be the undecorated publisher.
//
// A replay that fails aborts the start: Router.Run returns the
// [*ReplayError] (wrapped by the router) without the service ever counting as
// started, as it does when a subscription fails; the handlers already
// subscribed stop with Run's context. Like any router whose Run failed, it
// cannot be run again: build a new one to retry.
//
// The replay runs inside the last handler's Subscribe call, before that
// handler consumes: use a publisher that does not wait for the message to be
// handled (for GoChannel, leave BlockPublishUntilSubscriberAck off). A router
// without handlers replays after it is running and closes itself on failure.
func ReplayPlugin(reg *Registry, pub message.Publisher, cfg ReplayConfig, logger watermill.LoggerAdapter) message.RouterPlugin {
	return func(router *message.Router) error {
		r, err := newReplayer(reg, pub, cfg, logger)
		if err != nil {
			return err
		}
		expected := len(router.Handlers())
		if expected == 0 {
			go r.afterRunning(router)
			return nil
		}
		gate := &subscribeGate{expected: expected, replay: func(ctx context.Context) error {
			_, err := r.run(ctx)
			return err
		}}
		router.AddSubscriberDecorators(func(sub message.Subscriber) (message.Subscriber, error) {
			return &replayingSubscriber{Subscriber: sub, gate: gate}, nil
		})
		return nil
	}
}

func (r *replayer) afterRunning(router *message.Router) {
	<-router.Running()
	if router.IsClosed() {
		return
	}
	if _, err := r.run(context.Background()); err != nil {
		if cerr := router.Close(); cerr != nil {
			r.logger.Error("Closing router after failed replay", cerr, nil)
		}
	}
}

// subscribeGate counts the router's Subscribe calls and replays after the
// last one.
type subscribeGate struct {
	mu         sync.Mutex
	expected   int
	subscribed int
	done       bool
	replay     func(context.Context) error
}

func (g *subscribeGate) subscribed1(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.subscribed++
	if g.done || g.subscribed < g.expected {
		return nil
	}
	g.done = true
	return g.replay(ctx)
}

type replayingSubscriber struct {
	message.Subscriber
	gate *subscribeGate
}

func (s *replayingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ch, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	if err := s.gate.subscribed1(ctx); err != nil {
		return nil, fmt.Errorf("startup replay: %w", err)
	}
	return ch, nil
}
