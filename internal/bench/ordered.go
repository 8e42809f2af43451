package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/recordstore"
)

// orderedWorkload is one workload of the ordered cases: n messages to one
// tracked topic, perPublish to a Publish call, from publishers that take
// the next batch in turn; message i has the key keyOf(i).
type orderedWorkload struct {
	name       string
	n          int
	perPublish int
	publishers int
	keyOf      func(i int) string
}

// orderedWorkloads are the workloads of the ordered targets.
func orderedWorkloads(scale float64) []orderedWorkload {
	sized := func(n int) int { return max(int(float64(n)*scale), 100) }
	return []orderedWorkload{
		// A key's ten messages come one after the other, in one Publish.
		{name: "bursts: 1,000 keys, 10 messages each in a row, 50 per Publish, 4 publishers", n: sized(10_000), perPublish: 50, publishers: 4,
			keyOf: func(i int) string { return strconv.Itoa(i / 10 % 1000) }},
		// A key's next message comes 1,000 messages later.
		{name: "keys far apart: 1,000 keys in turn, 50 per Publish, 4 publishers", n: sized(10_000), perPublish: 50, publishers: 4,
			keyOf: func(i int) string { return strconv.Itoa(i % 1000) }},
		{name: "one hot key, 50 per Publish, 4 publishers", n: sized(2_000), perPublish: 50, publishers: 4,
			keyOf: func(int) string { return "hot" }},
	}
}

// orderedKey is the metadata key the ordered cases' topic orders by.
const orderedKey = "bench_key"

// orderedSteps compares, for each workload, the topic with an order key
// against the same topic without one, every option at its default.
func orderedSteps(ctx context.Context, d *database, o options, rep *report) error {
	scale := float64(o.saturatedN) / 10_000
	for _, w := range orderedWorkloads(scale) {
		m := d.newMeter()
		rs, err := sideBySide(o.saturatedRounds,
			func() (result, error) { return orderedCase(ctx, d, o, w, true, m) },
			func() (result, error) { return orderedCase(ctx, d, o, w, false, m) },
		)
		if err != nil {
			return err
		}
		group := fmt.Sprintf("ordered, %d messages", w.n)
		rep.add(group, w.name+", OrderKey set", w.publishers, rs[0], "msg/s")
		rep.add(group, w.name+", no OrderKey", w.publishers, rs[1], "msg/s")
		if w.keyOf(0) != w.keyOf(1) {
			// Keys far apart: the inserts alone, keyed and not, to tell
			// what the order index and the key locks cost before any
			// completion (the floor of the keyed topic's extra cost).
			ins, err := sideBySide(o.saturatedRounds,
				func() (result, error) { return orderedInserts(ctx, d, o, w, true, m) },
				func() (result, error) { return orderedInserts(ctx, d, o, w, false, m) },
			)
			if err != nil {
				return err
			}
			rep.add(group, w.name+", inserts alone, OrderKey set", w.publishers, ins[0], "msg/s")
			rep.add(group, w.name+", inserts alone, no OrderKey", w.publishers, ins[1], "msg/s")
		}
		switch {
		case w.keyOf(0) == w.keyOf(1) && w.keyOf(0) == w.keyOf(w.n-1):
			rep.atLeast("ordered, one hot key: ≥ 300 msg/s", rs[0].rate, 300, "%.0f msg/s")
		case w.keyOf(0) == w.keyOf(1):
			rep.ratio("ordered bursts: keyed ≥ 0.8× unordered", rs[0], rs[1], 0.8)
		default:
			if rs[0].cost != nil && rs[1].cost != nil && rs[1].cost["cpu"] > 0 {
				rep.atMost("ordered, keys far apart: DB CPU/msg ≤ 1.1× unordered", rs[0].cost["cpu"]/rs[1].cost["cpu"], 1.1, "%.2f×")
			}
			if rs[0].cost != nil && rs[1].cost != nil && rs[1].cost["wal"] > 0 {
				rep.atMost("ordered, keys far apart: WAL/msg ≤ 1.1× unordered", rs[0].cost["wal"]/rs[1].cost["wal"], 1.1, "%.2f×")
			}
		}
	}
	return nil
}

// orderedCtxKey carries a delivery's record id from the outermost
// middleware, which sees the outbox's metadata, to the handler.
type orderedCtxKey struct{}

// orderedCase runs one workload into a router on GoChannel with the
// outbox's middleware and replay plugin, every option at its default. It
// counts the rate until every message was handled and checks that each
// key's messages ran in the order they were saved: an inversion fails the
// case.
func orderedCase(ctx context.Context, d *database, o options, w orderedWorkload, keyed bool, m *meter) (result, error) {
	store, err := d.newStore(ctx, o.coalesced())
	if err != nil {
		return result{}, err
	}
	defer d.drop(context.Background(), store)
	// Claims read before they write: on SQLite, through a pool whose
	// transactions take the write lock as they begin.
	store, closeWriter, err := d.writerStore(store)
	if err != nil {
		return result{}, err
	}
	defer closeWriter()
	const topic = "bench_ordered"
	tracked := outbox.Tracked{Topic: topic, Store: store}
	if keyed {
		tracked.OrderKey = orderedKey
	}
	reg, err := outbox.NewRegistry(tracked)
	if err != nil {
		return result{}, err
	}
	gc := newGoChannel()
	defer func() { _ = gc.Close() }()
	pub, err := outbox.NewPublisher(reg, gc)
	if err != nil {
		return result{}, err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	if err != nil {
		return result{}, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return result{}, err
	}
	router.AddPlugin(outbox.ReplayPlugin(reg, gc, outbox.ReplayConfig{}, nil))
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			id, _ := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataID), 10, 64)
			msg.SetContext(context.WithValue(msg.Context(), orderedCtxKey{}, id))
			return h(msg)
		}
	})
	router.AddMiddleware(mw)
	var (
		mu          sync.Mutex
		seen        = make(map[string]bool, w.n)
		last        = map[string]int64{}
		inversions  int
		lastHandled atomic.Int64
	)
	all := make(chan struct{})
	router.AddNoPublisherHandler(topic, topic, gc, func(msg *message.Message) error {
		id, _ := msg.Context().Value(orderedCtxKey{}).(int64)
		key := msg.Metadata.Get(orderedKey)
		mu.Lock()
		defer mu.Unlock()
		if seen[msg.UUID] {
			return nil
		}
		seen[msg.UUID] = true
		if keyed && id < last[key] {
			inversions++
		}
		last[key] = max(last[key], id)
		lastHandled.Store(time.Now().UnixNano())
		if len(seen) == w.n {
			close(all)
		}
		return nil
	})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(runCtx) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return result{}, fmt.Errorf("router: %w", err)
	}

	m.start(ctx)
	start := time.Now()
	failed, firstErr := publishKeyed(pub, topic, w.n, w.perPublish, w.publishers, w.keyOf)
	// Lost are the messages still missing once none was handled for
	// defaultStall.
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
	var lost int64
wait:
	for {
		select {
		case <-all:
			break wait
		case <-watch.C:
			if time.Since(time.Unix(0, max(lastHandled.Load(), start.UnixNano()))) > defaultStall {
				mu.Lock()
				lost = int64(w.n - len(seen))
				mu.Unlock()
				break wait
			}
		}
	}
	elapsed := time.Unix(0, lastHandled.Load()).Sub(start)
	if err := router.Close(); err != nil {
		return result{}, err
	}
	if err := <-runErr; err != nil {
		return result{}, fmt.Errorf("router: %w", err)
	}
	// Every completion is in before the counters are read.
	if err := reg.WaitCompletions(ctx); err != nil {
		return result{}, err
	}
	handled := int64(w.n) - lost - failed
	if handled <= 0 {
		return result{}, errors.Join(errors.New("no message was handled"), firstErr)
	}
	r := result{rate: float64(handled) / elapsed.Seconds(), errors: failed, firstErr: firstErr, lost: lost}
	if r.cost, err = m.stop(ctx, handled); err != nil {
		return result{}, err
	}
	if inversions > 0 {
		return r, fmt.Errorf("%s: %d messages ran before an earlier message of their key", w.name, inversions)
	}
	return r, nil
}

// orderedInserts saves w's records with the store's Insert alone, from
// w's publishers, w.perPublish to a call, with their order keys or
// without: no publisher, broker or handler, nothing completed.
func orderedInserts(ctx context.Context, d *database, o options, w orderedWorkload, keyed bool, m *meter) (result, error) {
	store, err := d.newStore(ctx, o.coalesced())
	if err != nil {
		return result{}, err
	}
	defer d.drop(context.Background(), store)
	var next, failed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	m.start(ctx)
	start := time.Now()
	for range w.publishers {
		wg.Go(func() {
			for {
				first := int(next.Add(int64(w.perPublish))) - w.perPublish
				if first >= w.n {
					return
				}
				var recs []recordstore.Record
				for i := first; i < min(first+w.perPublish, w.n); i++ {
					r := recordstore.Record{Topic: "bench_ordered", UUID: watermill.NewUUID(), Payload: payload, Metadata: message.Metadata{sentKey: "0"}}
					if keyed {
						r.OrderKey = w.keyOf(i)
					}
					recs = append(recs, r)
				}
				if err := store.Insert(ctx, recs); err != nil {
					failed.Add(int64(len(recs)))
					once.Do(func() { firstErr = err })
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	saved := int64(w.n) - failed.Load()
	if saved <= 0 {
		return result{}, errors.Join(errors.New("no record was saved"), firstErr)
	}
	r := result{rate: float64(saved) / elapsed.Seconds(), errors: failed.Load(), firstErr: firstErr}
	if r.cost, err = m.stop(ctx, saved); err != nil {
		return result{}, err
	}
	return r, nil
}

// publishKeyed publishes n keyed messages (keyOf(i) the i-th's order key)
// to topic from publishers goroutines, perPublish in each Publish; it
// returns how many messages failed and the first error.
func publishKeyed(pub message.Publisher, topic string, n, perPublish, publishers int, keyOf func(int) string) (failed int64, firstErr error) {
	var next, failures atomic.Int64
	var once sync.Once
	var wg sync.WaitGroup
	for range publishers {
		wg.Go(func() {
			for {
				first := int(next.Add(int64(perPublish))) - perPublish
				if first >= n {
					return
				}
				var msgs []*message.Message
				for i := first; i < min(first+perPublish, n); i++ {
					msg := benchMessage()
					msg.Metadata.Set(orderedKey, keyOf(i))
					msgs = append(msgs, msg)
				}
				if err := pub.Publish(topic, msgs...); err != nil {
					failures.Add(int64(len(msgs)))
					once.Do(func() { firstErr = err })
				}
			}
		})
	}
	wg.Wait()
	return failures.Load(), firstErr
}
