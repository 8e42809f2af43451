package scenarios

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// orderLog is the handler of the order scenario: it fails a share of its
// handlings at random, and records, per key, the sequence number of each
// successful handling and whether two handlings of one key overlapped.
type orderLog struct {
	mu        sync.Mutex
	rnd       *rand.Rand
	failShare float64
	running   map[string]int
	overlaps  []string
	handled   map[string][]int
	distinct  map[string]bool
	progress  chan int // the number of distinct records handled, after each new one
}

func newOrderLog(failShare float64) *orderLog {
	return &orderLog{rnd: rand.New(rand.NewPCG(25, 25)), failShare: failShare, running: map[string]int{},
		handled: map[string][]int{}, distinct: map[string]bool{}, progress: make(chan int, 4096)}
}

func (o *orderLog) decide(msg *message.Message, _ int) error {
	key := msg.Metadata.Get("order_key")
	seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
	o.mu.Lock()
	o.running[key]++
	if o.running[key] > 1 {
		o.overlaps = append(o.overlaps, fmt.Sprintf("%s/%d", key, seq))
	}
	fail := o.rnd.Float64() < o.failShare
	o.mu.Unlock()
	time.Sleep(200 * time.Microsecond) // a handler that takes time, so that handlings could overlap
	o.mu.Lock()
	defer o.mu.Unlock()
	o.running[key]--
	if fail {
		return errTransient
	}
	o.handled[key] = append(o.handled[key], seq)
	if id := fmt.Sprintf("%s/%d", key, seq); !o.distinct[id] {
		o.distinct[id] = true
		o.progress <- len(o.distinct)
	}
	return nil
}

// waitHandled waits until n distinct records were handled successfully.
func (o *orderLog) waitHandled(t *testing.T, n int) {
	t.Helper()
	for {
		o.mu.Lock()
		got := len(o.distinct)
		o.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-o.progress:
		case <-time.After(waitTimeout):
			t.Fatalf("%d of %d records handled, no progress within %v", got, n, waitTimeout)
		}
	}
}

// orderedAcrossFailuresAndRestarts publishes 50 keys × 20 messages, keys
// interleaved, to a topic ordered by key, handled by two instances of one
// service (one consumer) on a store with a delivery lease; 30% of the
// handlings fail. Half way the service restarts, and the replay of the new
// instances sends the backlog again. Per key the successful handlings are
// in the order the records were saved, no two handlings of a key overlap,
// and every record completes.
func orderedAcrossFailuresAndRestarts(t *testing.T, e *env) {
	const keys, perKey = 50, 20
	leased, err := sqlstore.New(sqlstore.Config{Dialect: e.backend.Records.Dialect, Table: e.store.Table(), DB: e.db, Lease: 5 * time.Second, Completion: e.store.Completion()})
	require.NoError(t, err)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: e.topic, Store: leased, OrderKey: "order_key"})
	require.NoError(t, err)
	e.reg = reg

	log := newOrderLog(0.3)
	cfg := outbox.MiddlewareConfig{Check: outbox.CheckConfig{HeldResendAfter: 500 * time.Millisecond}, Backoff: outbox.Backoff{Initial: 5 * time.Millisecond, Max: 40 * time.Millisecond}}
	instances := func() []*service {
		var out []*service
		for range 2 {
			pub, sub := e.connect()
			s := e.startServiceWith(serviceConfig{reg: reg, pub: pub, decide: log.decide, mw: cfg, replay: outbox.ReplayConfig{Mode: outbox.ReplayAll},
				receivers: []receiver{{name: "handle_ordered", topic: e.topic, sub: sub}}})
			go s.drain()
			out = append(out, s)
		}
		return out
	}
	running := instances()

	pub, _ := e.connect()
	publisher := e.tracked(pub)
	var uuids []string
	for seq := 1; seq <= perKey; seq++ {
		msgs := make([]*message.Message, keys)
		for k := range keys {
			u := fmt.Sprintf("k%02d-%02d", k, seq)
			msgs[k] = message.NewMessage(u, []byte(fmt.Sprintf(`{"order":%q}`, u)))
			msgs[k].Metadata.Set("order_key", fmt.Sprintf("k%02d", k))
			msgs[k].Metadata.Set("seq", strconv.Itoa(seq))
			uuids = append(uuids, u)
		}
		publishSaved(t, publisher, e.topic, msgs)
	}

	log.waitHandled(t, keys*perKey/2)
	for _, s := range running {
		s.stop()
	}
	running = instances() // their replay sends the backlog
	log.waitHandled(t, keys*perKey)
	require.Eventually(t, func() bool {
		rows, err := e.readRows()
		if err != nil {
			return false
		}
		for _, r := range rows {
			if !r.Completed {
				return false
			}
		}
		return true
	}, waitTimeout, 20*time.Millisecond, "every record completes")
	for _, s := range running {
		s.stop()
	}

	log.mu.Lock()
	defer log.mu.Unlock()
	assert.Empty(t, log.overlaps, "handlings of one key overlapped")
	for k := range keys {
		key := fmt.Sprintf("k%02d", k)
		seqs := log.handled[key]
		for i := 1; i < len(seqs); i++ {
			if seqs[i] < seqs[i-1] {
				t.Errorf("key %s handled out of order: %v", key, seqs)
				break
			}
		}
	}
	e.requireTable(completedAll(uuids...))
}

// publishSaved publishes msgs in one Publish through a tracked publisher.
// On a loaded machine the records' one SQLite connection may be busy past
// the insert's deadline; nothing was saved then, and the publish is
// repeated.
func publishSaved(t *testing.T, publisher message.Publisher, topic string, msgs []*message.Message) {
	t.Helper()
	var err error
	for range 5 {
		var ie *outbox.InsertError
		if err = publisher.Publish(topic, msgs...); !errors.As(err, &ie) || ie.OutcomeUnknown {
			break
		}
	}
	require.NoError(t, err)
}

// drain discards the service's deliveries until it stops, for a scenario
// that watches its handler instead.
func (s *service) drain() {
	for {
		select {
		case <-s.deliveries:
		case <-s.stopping:
			return
		}
	}
}
