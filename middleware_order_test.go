package outbox_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// orderKit is what a row builds its middleware chain from.
type orderKit struct {
	t        *testing.T
	outbox   message.HandlerMiddleware
	poisoned *poisonSink
}

// poisonSink keeps the messages a poison queue publishes.
type poisonSink struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (p *poisonSink) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, msgs...)
	return nil
}

func (p *poisonSink) Close() error { return nil }

func (p *poisonSink) snapshot() []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*message.Message(nil), p.msgs...)
}

// poison is Watermill's PoisonQueue, diverting the errors filter accepts
// (every error when filter is nil) to the kit's publisher.
func (k orderKit) poison(filter func(error) bool) message.HandlerMiddleware {
	var mw message.HandlerMiddleware
	var err error
	if filter == nil {
		mw, err = middleware.PoisonQueue(k.poisoned, "poison")
	} else {
		mw, err = middleware.PoisonQueueWithFilter(k.poisoned, "poison", filter)
	}
	require.NoError(k.t, err)
	return mw
}

func retry() message.HandlerMiddleware {
	return middleware.Retry{MaxRetries: 2, InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond, Multiplier: 2}.Middleware
}

func throttle() message.HandlerMiddleware {
	return middleware.NewThrottle(100, time.Second).Middleware
}

// state is what a scenario leaves in the table.
type state int

const (
	noRecord state = iota
	completed
	abandoned
	pending
	pendingOrAbandoned // depends on how soon the broker redelivers
)

// outcome is how a scenario ends: how often the handler ran (at least,
// at most), the record's state, and how many messages the poison queue
// received.
type outcome struct {
	minRuns, maxRuns int
	state            state
	poisoned         int
}

func exactly(runs int, s state, poisoned int) outcome {
	return outcome{minRuns: runs, maxRuns: runs, state: s, poisoned: poisoned}
}

// The scenarios every row runs; MaxAttempts is 3.
var (
	abandonedAfterThree = exactly(3, abandoned, 0)
	handledOnce         = exactly(1, completed, 0)
)

// TestMiddlewareOrders runs, for each order of Watermill's middleware
// around the outbox middleware that a user meets, a handler that always
// fails, one that always panics, one that drops, one that succeeds, and a
// message whose outbox_id is malformed. Each ends within a bounded number
// of runs, with the record completed, abandoned or (where the order gives
// the message away) still pending; a copy held for the backoff is logged
// as an error in no order, is not retried by Retry and is not diverted by a
// PoisonQueue. docs/how-it-works.md lists the rows.
//
// Middlewares are listed outermost first: Watermill applies the first
// added middleware outermost.
func TestMiddlewareOrders(t *testing.T) {
	t.Parallel()
	rows := []struct {
		name  string
		chain func(k orderKit) []message.HandlerMiddleware
		// fails, panics and drops are the outcomes of the handler that
		// always fails, always panics, and drops.
		fails, panics, drops outcome
	}{
		{
			// The order docs/how-it-works.md recommends, all together.
			name: "Recommended",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{middleware.Recoverer, k.poison(outbox.IsAbandoned), k.outbox, retry(), k.poison(outbox.IsDrop)}
			},
			fails: exactly(9, abandoned, 1), panics: exactly(3, abandoned, 1), drops: exactly(1, completed, 1),
		},
		{
			name:  "OutboxAlone",
			chain: func(k orderKit) []message.HandlerMiddleware { return []message.HandlerMiddleware{k.outbox} },
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: handledOnce,
		},
		{
			name: "RecovererOutside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{middleware.Recoverer, k.outbox}
			},
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: handledOnce,
		},
		{
			name: "RecovererInside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.outbox, middleware.Recoverer}
			},
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: handledOnce,
		},
		{
			// Each try of Retry is checked again: a try that comes before
			// the backoff is held and nacked, and after the record is
			// abandoned the tries Retry has left run the handler untracked.
			name: "RetryOutside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{retry(), k.outbox}
			},
			fails:  outcome{minRuns: 3, maxRuns: 5, state: abandoned},
			panics: outcome{minRuns: 3, maxRuns: 5, state: abandoned},
			drops:  handledOnce,
		},
		{
			// One delivery is one attempt, with Retry's tries inside it;
			// a panic is not retried by Retry, a drop is (unless
			// ShouldRetry says no to outbox.IsDrop).
			name: "RetryInside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.outbox, retry()}
			},
			fails: exactly(9, abandoned, 0), panics: abandonedAfterThree, drops: exactly(3, completed, 0),
		},
		{
			name: "PoisonDroppedInside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.outbox, k.poison(outbox.IsDrop)}
			},
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: exactly(1, completed, 1),
		},
		{
			// Not supported: the outbox acknowledges a dropped message,
			// the poison queue outside never sees the drop.
			name: "PoisonDroppedOutside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.poison(outbox.IsDrop), k.outbox}
			},
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: handledOnce,
		},
		{
			name: "PoisonAbandonedOutside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.poison(outbox.IsAbandoned), k.outbox}
			},
			fails: exactly(3, abandoned, 1), panics: exactly(3, abandoned, 1), drops: handledOnce,
		},
		{
			// Not supported: the AbandonedError is made outside the poison
			// queue, which never sees it.
			name: "PoisonAbandonedInside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.outbox, k.poison(outbox.IsAbandoned)}
			},
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: handledOnce,
		},
		{
			// Not supported: the queue takes every error, the outbox's own
			// nacks too; the message leaves at its first failure and the
			// record stays pending for the next replay.
			name: "PoisonQueueOutside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.poison(nil), k.outbox}
			},
			fails:  exactly(1, pending, 1),
			panics: outcome{minRuns: 1, maxRuns: 3, state: pendingOrAbandoned, poisoned: 1},
			drops:  handledOnce,
		},
		{
			// Every handler error is diverted and counts as handled; a
			// panic goes past the queue and counts as a failed attempt.
			name: "PoisonQueueInside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.outbox, k.poison(nil)}
			},
			fails: exactly(1, completed, 1), panics: abandonedAfterThree, drops: exactly(1, completed, 1),
		},
		{
			name: "ThrottleOutside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{throttle(), k.outbox}
			},
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: handledOnce,
		},
		{
			name: "ThrottleInside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.outbox, throttle()}
			},
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: handledOnce,
		},
		{
			name: "TimeoutOutside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{middleware.Timeout(time.Second), k.outbox}
			},
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: handledOnce,
		},
		{
			name: "TimeoutInside",
			chain: func(k orderKit) []message.HandlerMiddleware {
				return []message.HandlerMiddleware{k.outbox, middleware.Timeout(time.Second)}
			},
			fails: abandonedAfterThree, panics: abandonedAfterThree, drops: handledOnce,
		},
	}

	sqlite := testenv.Backends()[1]
	require.Equal(t, "SQLite", sqlite.Name)
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			scenarios := []struct {
				name    string
				handler func(runs *runCounter) message.NoPublishHandlerFunc
				want    outcome
			}{
				{"AlwaysFails", func(runs *runCounter) message.NoPublishHandlerFunc {
					return func(*message.Message) error { runs.add(); return errors.New("always fails") }
				}, row.fails},
				{"AlwaysPanics", func(runs *runCounter) message.NoPublishHandlerFunc {
					return func(*message.Message) error { runs.add(); panic("always panics") }
				}, row.panics},
				{"Drops", func(runs *runCounter) message.NoPublishHandlerFunc {
					return func(*message.Message) error { runs.add(); return outbox.Drop(errors.New("unreadable")) }
				}, row.drops},
				{"Succeeds", func(runs *runCounter) message.NoPublishHandlerFunc {
					return func(*message.Message) error { runs.add(); return nil }
				}, handledOnce},
				{"MalformedID", func(runs *runCounter) message.NoPublishHandlerFunc {
					return func(*message.Message) error { runs.add(); return nil }
				}, exactly(1, noRecord, 0)},
			}
			for _, sc := range scenarios {
				for _, path := range []struct {
					name string
					fast bool
				}{{"CheckedPath", false}, {"Defaults", true}} {
					t.Run(sc.name+"/"+path.name, func(t *testing.T) {
						t.Parallel()
						b := setup(t, sqlite, sqlstore.Mark)
						mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{
							MaxAttempts: 3,
							Backoff:     outbox.Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond},
							// The defaults: completions in the background,
							// first copies unchecked; or the checked path.
							Check:    outbox.CheckConfig{FirstCopies: !path.fast},
							Complete: outbox.CompleteConfig{BeforeAck: !path.fast},
						}, b.logger)
						require.NoError(t, err)
						k := orderKit{t: t, outbox: mw, poisoned: &poisonSink{}}
						runs := &runCounter{}
						s := runService(t, b, row.chain(k), sc.handler(runs))

						msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
						if sc.name == "MalformedID" {
							b.ownMetadata(t, msg, "abc")
							publishUntilAcked(t, s.gc, b.topic, msg, runs)
						} else {
							publishUntilAcked(t, s.pub, b.topic, msg, runs)
						}

						// The message was acked: nothing of it is left to run,
						// once the completions in the background are done.
						require.NoError(t, b.reg.WaitCompletions(b.ctx(t)))
						got := runs.count()
						assert.GreaterOrEqual(t, got, sc.want.minRuns, "handler runs")
						assert.LessOrEqual(t, got, sc.want.maxRuns, "handler runs")
						st := b.status(t)
						switch sc.want.state {
						case noRecord:
							assert.Equal(t, recordstore.TopicStatus{Topic: b.topic}, st)
						case completed:
							assert.Equal(t, recordstore.TopicStatus{Topic: b.topic, Completed: 1}, st)
						case abandoned:
							assert.Equal(t, recordstore.TopicStatus{Topic: b.topic, Abandoned: 1}, st)
						case pending:
							assert.Equal(t, recordstore.TopicStatus{Topic: b.topic, Pending: 1}, st)
						case pendingOrAbandoned:
							assert.Contains(t, []recordstore.TopicStatus{{Topic: b.topic, Pending: 1}, {Topic: b.topic, Abandoned: 1}}, st)
						}
						poisoned := k.poisoned.snapshot()
						assert.Len(t, poisoned, sc.want.poisoned, "messages diverted to the poison queue")
						for _, p := range poisoned {
							assert.Equal(t, msg.UUID, p.UUID)
						}

						deliveries, _ := s.seen.snapshot()
						lines := errorLines(b.logger, s.logger)
						t.Logf("handler runs %d, deliveries %d, error lines %d, poisoned %d", got, deliveries, len(lines), len(poisoned))
						assert.LessOrEqual(t, deliveries, 20, "deliveries: nothing spins")
						assert.LessOrEqual(t, len(lines), 30, "error lines: nothing spins")
						for _, e := range lines {
							assert.NotErrorIs(t, e.Err, recordstore.ErrNotDue, "a copy held for the backoff is not an error: %s", e.Msg)
						}
						if sc.name == "MalformedID" {
							require.Len(t, lines, 1, "one Error line for a malformed id")
							assert.ErrorIs(t, lines[0].Err, outbox.ErrInvalidMetadata)
						}
					})
				}
			}
		})
	}
}
