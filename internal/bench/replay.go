package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// replayResult is the replay case: rows per second, and how much memory grew
// while it ran.
type replayResult struct {
	rows          int
	load          time.Duration
	result        result
	firstDelivery time.Duration
	heapGrowth    uint64 // peak heap object bytes above the start
	rssGrowth     uint64 // peak resident set above the start
	rssMeasured   bool
}

// drainTimeout bounds the wait for the last replayed messages.
const drainTimeout = 2 * time.Minute

// replayCase replays rows pending records into GoChannel, where a
// subscriber acknowledges them, and samples memory while it runs.
func replayCase(ctx context.Context, d *database, rows int) (replayResult, error) {
	rr := replayResult{rows: rows}
	store, err := d.newStore(ctx, sqlstore.Coalescing{})
	if err != nil {
		return rr, err
	}
	defer d.drop(ctx, store)
	start := time.Now()
	if err := fillTable(ctx, d, store, fill{rows: rows, topics: []string{"replay"}}); err != nil {
		return rr, err
	}
	rr.load = time.Since(start)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "replay", Store: store})
	if err != nil {
		return rr, err
	}
	// Publish returns once the subscriber has the message, so that what is
	// measured is replay at the pace of delivery, not a queue of goroutines.
	gc := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer gc.Close()
	msgs, err := gc.Subscribe(ctx, "replay")
	if err != nil {
		return rr, err
	}
	var delivered atomic.Int64
	var first atomic.Int64
	all := make(chan struct{})
	go func() {
		for m := range msgs {
			m.Ack()
			if n := delivered.Add(1); n == 1 {
				first.Store(time.Now().UnixNano())
			} else if n == int64(rows) {
				close(all)
			}
		}
	}()

	runtime.GC()
	sampler := startMemorySampler()
	start = time.Now()
	res, err := outbox.Replay(ctx, reg, gc, outbox.ReplayConfig{}, nil)
	if err != nil {
		sampler.stop()
		return rr, err
	}
	select {
	case <-all:
	case <-time.After(drainTimeout):
		sampler.stop()
		return rr, fmt.Errorf("replayed %d, delivered %d of %d", res.Total(), delivered.Load(), rows)
	}
	elapsed := time.Since(start)
	rr.heapGrowth, rr.rssGrowth, rr.rssMeasured = sampler.stop()
	rr.firstDelivery = time.Unix(0, first.Load()).Sub(start)
	rr.result = result{rate: float64(rows) / elapsed.Seconds()}
	if res.Total() != rows {
		return rr, fmt.Errorf("replay sent %d of %d records", res.Total(), rows)
	}
	return rr, nil
}

// memorySampler follows the heap and the resident set while a case runs:
// the heap every 2 ms, the resident set every 20 ms and through the kernel's
// peak (VmHWM), which it resets first where Linux allows.
type memorySampler struct {
	done     chan struct{}
	finished chan struct{}
	heapBase uint64
	heapPeak uint64
	rssBase  uint64
	rssPeak  uint64 // sampled, beside the kernel's VmHWM
	rssReset bool
}

const heapObjects = "/memory/classes/heap/objects:bytes"

func readHeap(s []metrics.Sample) uint64 {
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func startMemorySampler() *memorySampler {
	m := &memorySampler{done: make(chan struct{}), finished: make(chan struct{})}
	sample := []metrics.Sample{{Name: heapObjects}}
	m.heapBase = readHeap(sample)
	m.heapPeak = m.heapBase
	// Writing 5 to clear_refs resets the peak resident set (VmHWM) to the
	// current one, so the peak seen later is this case's.
	m.rssReset = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	m.rssBase, _ = procStatus("VmRSS")
	go func() {
		defer close(m.finished)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for tick := 0; ; tick++ {
			select {
			case <-m.done:
				return
			case <-t.C:
				m.heapPeak = max(m.heapPeak, readHeap(sample))
				if tick%10 == 0 {
					if rss, ok := procStatus("VmRSS"); ok {
						m.rssPeak = max(m.rssPeak, rss)
					}
				}
			}
		}
	}()
	return m
}

// stop returns the peak growth of the heap and, when it could be measured,
// of the resident set.
func (m *memorySampler) stop() (heap, rss uint64, rssOK bool) {
	close(m.done)
	<-m.finished
	peak, ok := procStatus("VmHWM")
	if !m.rssReset || !ok {
		peak = 0 // the kernel's peak covers the whole process's life
	}
	peak = max(peak, m.rssPeak)
	if peak > 0 {
		rss, rssOK = max(peak, m.rssBase)-m.rssBase, true
	}
	return m.heapPeak - m.heapBase, rss, rssOK
}

// procStatus reads a size in bytes from /proc/self/status.
func procStatus(field string) (uint64, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return 0, false
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			return kb * 1024, err == nil
		}
	}
	return 0, false
}
