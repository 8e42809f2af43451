package outbox

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/internal/background"
	"github.com/wmoutbox/outbox/internal/firstcopy"
	"github.com/wmoutbox/outbox/internal/keyorder"
	"github.com/wmoutbox/outbox/recordstore"
)

// Tracked names one tracked topic and the store its records are saved into.
type Tracked struct {
	// Topic is the topic messages are published to, stamped into the
	// metadata ([MetadataTopic]).
	Topic string
	// Store saves the records of this topic; topics may share one.
	Store recordstore.Store
	// Consumers are the names of the Watermill handlers that receive this
	// topic in every service that shares the store. Each checks and
	// completes its own delivery; the record is complete when all have. A
	// handler not listed runs untracked and is logged. Defaults to none:
	// one receiver (instances of one service share its handler name).
	Consumers []string
	// RemoteConsumers are the handler names of the receivers in other
	// services, with databases of their own, which confirm their
	// deliveries over the broker ([AddConfirmationHandler]). Names are
	// unique across Consumers and RemoteConsumers. Defaults to none.
	RemoteConsumers []string
	// ConfirmTopic is where the remote consumers confirm; not a tracked
	// topic. Defaults to [DefaultConfirmTopic].
	ConfirmTopic string
	// CompletedBy says who completes the records. Defaults to [ByConsumers].
	CompletedBy CompletedBy
	// OrderKey names the metadata key whose value orders the topic's
	// messages: for each consumer, records of one key are handled one at a
	// time, in the order they were saved; remote consumers too, when their
	// service keeps an inbox (docs/guarantees.md, "Order by key").
	// Defaults to "": not ordered, at no cost.
	OrderKey string
	// OrderSkipsAbandoned lets an abandoned record stop holding the later
	// records of its key. Defaults to false: the key waits for a requeue.
	OrderSkipsAbandoned bool
}

// Confirmations' names.
const (
	// DefaultConfirmTopic is the topic remote consumers confirm to when
	// [Tracked.ConfirmTopic] is empty.
	DefaultConfirmTopic = "outbox_confirmations"
	// ConfirmationHandlerName prefixes the handler names that
	// [AddConfirmationHandler] adds: "outbox_confirmations:<topic>".
	ConfirmationHandlerName = "outbox_confirmations"
)

// Defaults of the configurations.
const (
	// DefaultStatementTimeout bounds each database statement whose context
	// has no deadline and whose configuration sets none, so that a
	// database that never answers fails the call instead of hanging it.
	DefaultStatementTimeout = 30 * time.Second
	// DefaultMaxPageBytes bounds a page of replay and a claim of the stale
	// resubmitter: 16 MiB of payloads and metadata.
	DefaultMaxPageBytes = 16 << 20
)

// CompletedBy says who completes the records of a tracked topic.
type CompletedBy int

const (
	// ByConsumers: each receiver completes its own delivery once its
	// handler has succeeded (a remote consumer by a confirmation); the
	// record is resent until all have. The default.
	ByConsumers CompletedBy = iota
	// OnSend: the record is complete once the wrapped publisher returned
	// nil for it, as in the classic outbox, for receivers that do not run
	// this plugin: "handed to the broker at least once". It takes no
	// Consumers or RemoteConsumers.
	OnSend
)

// String returns "by consumers" or "on send".
func (c CompletedBy) String() string {
	switch c {
	case ByConsumers:
		return "by consumers"
	case OnSend:
		return "on send"
	}
	return fmt.Sprintf("CompletedBy(%d)", int(c))
}

// tracked is the registry's entry for one tracked topic.
type tracked struct {
	topic     string
	store     recordstore.Store
	consumers []string
	// remote are the remote consumers, deliveries all consumers (local
	// first), saved with each record; confirmTo is the confirmation topic,
	// "" without remote consumers.
	remote      []string
	deliveries  []string
	confirmTo   string
	completedBy CompletedBy
	// orderKey is Tracked.OrderKey, skipAbandoned OrderSkipsAbandoned;
	// holds tells the held copies waiting for a record (ordering.go).
	orderKey      string
	skipAbandoned bool
	holds         keyorder.Waiters
	// first is the first handler that received the name, to detect a
	// second handler of a name without declared consumers; conflicts logs
	// each conflict once.
	first     atomic.Pointer[string]
	conflicts sync.Map // "a\x00b" -> struct{}
	// subscriptions counts the router subscriptions to the name seen by
	// [ReplayPlugin].
	subscriptions atomic.Int32
	// subscribed is set when a router's handler subscribes to the topic.
	subscribed atomic.Bool
	// unreceived is set when a router with [ReplayPlugin] started with no
	// handler subscribed to the topic, and cleared when one subscribes or
	// the middleware admits a delivery of it (receivedHere).
	unreceived atomic.Bool
	// seen holds, per delivery (in the order of deliveries), when this
	// process last recorded the receiver seen; seenOne the same for the
	// receiver of a topic without declared consumers (receivers_seen.go).
	seen    []atomic.Int64
	seenOne atomic.Int64
	// confirmed holds, per delivery, when this process last took a
	// confirmation of a remote consumer (monotonic, as seen).
	confirmed []atomic.Int64
	// firstCopies are the records this process published lately, whose
	// first copies may skip the check (first_copy.go).
	firstCopies firstcopy.Set
	// completing are the deliveries whose completion runs in the
	// background (settlement.go): a copy that arrives meanwhile waits for
	// it before its check.
	completing sync.Map // completingKey -> *completion
	// window gathers the completions of each batch window, for a store
	// that completes them with one call (completion_window.go).
	window completionWindows
	// claims are the keys whose next record is claimed after a batch of
	// completions (ordering.go).
	claims keyClaims
	// remoteClaims are the keys whose next record is claimed after a
	// batch of remote consumers' confirmations (remote_order.go);
	// unorderedRemote is set once the store was found unable to name
	// the earlier message of a key.
	remoteClaims    remoteClaims
	unorderedRemote atomic.Bool
	// deferred are the messages the publisher holds for the earlier record
	// of their key (deferred_sends.go).
	deferred deferredSends
	// waiting are the records whose message waits in this process for
	// the earlier record of its key: held in the publisher or parked.
	waiting sync.Map // record id -> struct{}
}

// completion is a delivery's completion in the background: done is closed
// once it ended, and ok then says whether the record is complete.
type completion struct {
	done chan struct{}
	ok   bool
}

// completingKey names a delivery whose completion is in flight.
type completingKey struct {
	id       int64
	consumer string
}

func (t *tracked) declares(consumer string) bool { return slices.Contains(t.consumers, consumer) }

// hasDelivery reports whether the topic's records have a delivery for the
// consumer: a local or a remote one.
func (t *tracked) hasDelivery(consumer string) bool { return slices.Contains(t.deliveries, consumer) }

// Registry names the tracked topics and the store each one saves into. It is
// built once and read without locks; an untracked topic costs one map lookup.
type Registry struct {
	enabled bool
	byTopic map[string]*tracked
	topics  []string
	obs     atomic.Pointer[observerBox]
	trc     atomic.Pointer[tracerBox]
	// log is the first logger given to the registry's middleware or
	// replay, for the paths that take none (the publisher).
	log     atomic.Pointer[loggerBox]
	offOnce sync.Once
	// res is the sender of the running stale resubmitter that started
	// last (senders, under resMu, are those of all that run), through
	// which the middleware sends the records of order keys again
	// (ordering.go).
	res     atomic.Pointer[resender]
	resMu   sync.Mutex
	senders []*resender
	// background counts what the outbox runs off the handlers' paths and
	// the router plugins' loops (background.go).
	background background.Work
	// failurePolicy is the MaxAttempts and Backoff of the first
	// middleware built on the registry, which also count the failures
	// that remote consumers report (confirmation_handler.go).
	failurePolicy atomic.Pointer[failurePolicy]
	// heldWait is the Check.HeldWait of the first middleware built on the
	// registry, how long its publishers hold a message for the earlier
	// record of its key (deferred_sends.go); 0 until one is built.
	heldWait atomic.Int64
	// receivers holds, per topic and remote consumer, the receiving
	// service that confirmed under its name first, to report a second
	// one.
	receivers sync.Map // "topic\x00consumer" -> string
}

// failurePolicy is how failed attempts are counted and spaced.
type failurePolicy struct {
	maxAttempts int
	backoff     Backoff
}

// failures returns the registry's failure policy: its middleware's, or
// the defaults when none was built.
func (r *Registry) failures() failurePolicy {
	if p := r.failurePolicy.Load(); p != nil {
		return *p
	}
	var p failurePolicy
	p.backoff.setDefaults()
	return p
}

// NewRegistry builds a registry of the tracked topics: non-empty and
// unique, each with a store, consumer names non-empty and unique within
// their topic. Inside a test binary it tracks only with [EnvToggle] on.
func NewRegistry(tracked ...Tracked) (*Registry, error) {
	return newRegistry(trackingEnabled(), tracked)
}

// NewTrackingRegistry is [NewRegistry] for test kits: it tracks in a test
// binary too, without reading [EnvToggle], so tests may run in parallel.
func NewTrackingRegistry(tracked ...Tracked) (*Registry, error) {
	return newRegistry(true, tracked)
}

func newRegistry(enabled bool, tracked []Tracked) (*Registry, error) {
	r := &Registry{enabled: enabled}
	byTopic, err := buildEntries(tracked)
	if err != nil {
		return nil, err
	}
	for topic := range byTopic {
		r.topics = append(r.topics, topic)
	}
	sort.Strings(r.topics)
	if r.enabled {
		// A test binary without the toggle keeps no entries: nothing is
		// tracked, every lookup misses, and the publisher, middleware and
		// replay pass through.
		r.byTopic = byTopic
	}
	return r, nil
}

func buildEntries(list []Tracked) (map[string]*tracked, error) {
	byTopic := make(map[string]*tracked, len(list))
	for i, t := range list {
		if t.Topic == "" {
			return nil, fmt.Errorf("%w: tracked topic #%d is empty", ErrInvalidConfig, i)
		}
		if t.Store == nil {
			return nil, fmt.Errorf("%w: tracked topic %q has no store", ErrInvalidConfig, t.Topic)
		}
		if _, dup := byTopic[t.Topic]; dup {
			return nil, fmt.Errorf("%w: tracked topic %q registered twice", ErrInvalidConfig, t.Topic)
		}
		all := slices.Concat(t.Consumers, t.RemoteConsumers)
		for j, c := range all {
			if c == "" {
				return nil, fmt.Errorf("%w: consumer #%d of tracked topic %q is empty", ErrInvalidConfig, j, t.Topic)
			}
			if slices.Index(all, c) != j {
				return nil, fmt.Errorf("%w: consumer %q of tracked topic %q listed twice (Consumers and RemoteConsumers share one list of names)", ErrInvalidConfig, c, t.Topic)
			}
		}
		e := &tracked{topic: t.Topic, store: t.Store, consumers: slices.Clone(t.Consumers), completedBy: t.CompletedBy,
			orderKey: t.OrderKey, skipAbandoned: t.OrderSkipsAbandoned}
		if t.OrderKey != "" && t.CompletedBy == OnSend {
			return nil, fmt.Errorf("%w: tracked topic %q completes on send, so no receiver could hold its records in order: it takes no OrderKey", ErrInvalidConfig, t.Topic)
		}
		if t.OrderKey == "" && t.OrderSkipsAbandoned {
			return nil, fmt.Errorf("%w: tracked topic %q sets OrderSkipsAbandoned without an OrderKey", ErrInvalidConfig, t.Topic)
		}
		switch t.CompletedBy {
		case ByConsumers:
		case OnSend:
			if len(all) > 0 {
				return nil, fmt.Errorf("%w: tracked topic %q completes on send and so takes no Consumers or RemoteConsumers", ErrInvalidConfig, t.Topic)
			}
		default:
			return nil, fmt.Errorf("%w: tracked topic %q has an unknown CompletedBy %d", ErrInvalidConfig, t.Topic, int(t.CompletedBy))
		}
		if len(t.RemoteConsumers) > 0 {
			e.remote = slices.Clone(t.RemoteConsumers)
			e.confirmTo = cmp.Or(t.ConfirmTopic, DefaultConfirmTopic)
		} else if t.ConfirmTopic != "" {
			return nil, fmt.Errorf("%w: tracked topic %q has a ConfirmTopic but no RemoteConsumers", ErrInvalidConfig, t.Topic)
		}
		if len(all) > 0 {
			e.deliveries = all
			e.seen = make([]atomic.Int64, len(all))
			e.confirmed = make([]atomic.Int64, len(all))
		}
		byTopic[t.Topic] = e
	}
	for _, e := range byTopic {
		if e.confirmTo != "" && byTopic[e.confirmTo] != nil {
			return nil, fmt.Errorf("%w: the confirmation topic %q of tracked topic %q is itself tracked", ErrInvalidConfig, e.confirmTo, e.topic)
		}
	}
	return byTopic, nil
}

// Enabled reports whether the registry tracks messages; false only inside a
// test binary without the toggle.
func (r *Registry) Enabled() bool { return r.enabled }

// Topics returns the tracked topics, sorted.
func (r *Registry) Topics() []string { return append([]string(nil), r.topics...) }

// Store returns the store of a tracked topic, or nil when the topic is not
// tracked (or tracking is off).
func (r *Registry) Store(topic string) recordstore.Store {
	if t := r.byTopic[topic]; t != nil {
		return t.store
	}
	return nil
}

// Consumers returns the declared consumers of a tracked topic; nil when it
// declares none or is not tracked.
func (r *Registry) Consumers(topic string) []string {
	if t := r.byTopic[topic]; t != nil {
		return slices.Clone(t.consumers)
	}
	return nil
}

// RemoteConsumers returns the declared remote consumers of a tracked topic;
// nil when it declares none or is not tracked.
func (r *Registry) RemoteConsumers(topic string) []string {
	if t := r.byTopic[topic]; t != nil {
		return slices.Clone(t.remote)
	}
	return nil
}

// hasRemote reports whether a tracked topic has remote consumers.
func (r *Registry) hasRemote() bool {
	return slices.ContainsFunc(r.entries(), func(t *tracked) bool { return len(t.remote) > 0 })
}

// confirmedBy records that a remote consumer's confirmation matched one of
// its deliveries now.
func (t *tracked) confirmedBy(consumer string) {
	if i := slices.Index(t.deliveries, consumer); i >= 0 {
		t.confirmed[i].Store(int64(time.Since(processStart)) + 1)
	}
}

// lastConfirmed is how long ago this process last took a confirmation of
// the consumer; false when it took none.
func (t *tracked) lastConfirmed(consumer string, now time.Time) (time.Duration, bool) {
	i := slices.Index(t.deliveries, consumer)
	if i < 0 {
		return 0, false
	}
	at := t.confirmed[i].Load()
	if at == 0 {
		return 0, false
	}
	return now.Sub(processStart) - time.Duration(at-1), true
}

type loggerBox struct{ l watermill.LoggerAdapter }

// useLogger keeps logger for the paths that are given none, unless one is
// kept already.
func (r *Registry) useLogger(logger watermill.LoggerAdapter) {
	if logger != nil {
		r.log.CompareAndSwap(nil, &loggerBox{l: logger})
	}
}

// logger returns the kept logger, or one that discards.
func (r *Registry) logger() watermill.LoggerAdapter {
	if b := r.log.Load(); b != nil {
		return b.l
	}
	return watermill.NopLogger{}
}

// lookup returns the entry of a tracked topic, or nil.
func (r *Registry) lookup(topic string) *tracked { return r.byTopic[topic] }

// entries returns the entries in name order.
func (r *Registry) entries() []*tracked {
	out := make([]*tracked, 0, len(r.byTopic))
	for _, topic := range r.topics {
		if t := r.byTopic[topic]; t != nil {
			out = append(out, t)
		}
	}
	return out
}

// stores returns each distinct store once, with the first name (in name
// order) that uses it.
func (r *Registry) stores() []*tracked {
	var out []*tracked
	for _, t := range r.entries() {
		if !slices.ContainsFunc(out, func(o *tracked) bool { return sameStore(o.store, t.store) }) {
			out = append(out, t)
		}
	}
	return out
}

// EnvToggle is the environment variable ("on") that turns tracking on in a
// test binary, read when a registry is built.
const EnvToggle = "WATERMILL_OUTBOX"

// trackingEnabled reports whether registries built now track messages. A
// normal binary always does and never looks at the environment.
func trackingEnabled() bool {
	if !testing.Testing() {
		return true
	}
	return os.Getenv(EnvToggle) == "on"
}

// reportDisabled tells, once per registry, that a test binary without the
// toggle tracks nothing: a program that checks for "0 pending" would
// otherwise pass without any record ever being written.
func (r *Registry) reportDisabled(logger watermill.LoggerAdapter) {
	r.useLogger(logger)
	if r.enabled {
		return
	}
	r.offOnce.Do(func() {
		logger.Info("Outbox tracking is off in this test binary: messages pass through untracked and no record is written. "+
			"Set "+EnvToggle+"=on to track them", watermill.LogFields{"env": EnvToggle})
	})
}
