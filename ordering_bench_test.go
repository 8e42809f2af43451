package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// BenchmarkOrderedEndToEnd publishes b.N messages to one tracked topic on
// PostgreSQL from 1, 4 and 16 publishers into a router on GoChannel, with
// no order key and with 1, 16 and 10,000 keys, and reports the messages
// completed per second and the statements sent per message. Run it with a
// fixed count:
//
//	go test -run '^$' -bench BenchmarkOrderedEndToEnd -benchtime 2000x .
func BenchmarkOrderedEndToEnd(b *testing.B) {
	for _, keys := range []int{0, 1, 16, 10_000} {
		for _, publishers := range []int{1, 4, 16} {
			name := fmt.Sprintf("keys=%d/publishers=%d", keys, publishers)
			if keys == 0 {
				name = fmt.Sprintf("keys=none/publishers=%d", publishers)
			}
			b.Run(name, func(b *testing.B) { benchOrdered(b, keys, publishers) })
		}
	}
}

func benchOrdered(b *testing.B, keys, publishers int) {
	db, counter := testenv.CountingPostgres(b)
	store := testenv.NewStore(b, testenv.Backends()[0], db, sqlstore.Mark)
	tracked := outbox.Tracked{Topic: "orders", Store: store}
	if keys > 0 {
		tracked.OrderKey = "key"
	}
	reg, err := outbox.NewTrackingRegistry(tracked)
	require.NoError(b, err)
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, watermill.NopLogger{})
	b.Cleanup(func() { _ = gc.Close() })
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	require.NoError(b, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(b, err)
	router.AddMiddleware(mw)
	router.AddPlugin(outbox.ReplayPlugin(reg, gc, outbox.ReplayConfig{Resubmit: outbox.StaleResubmitterConfig{OlderThan: 2 * time.Second, Interval: time.Second}}, nil))
	var mu sync.Mutex
	seen := map[string]bool{}
	all := make(chan struct{})
	n := b.N
	router.AddNoPublisherHandler("handle", "orders", gc, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if !seen[msg.UUID] {
			seen[msg.UUID] = true
			if len(seen) == n {
				close(all)
			}
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-runErr })
	<-router.Running()
	pub, err := outbox.NewPublisher(reg, gc)
	require.NoError(b, err)

	before := counter.Count("")
	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range publishers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				msg := message.NewMessage(strconv.FormatInt(i, 10), []byte(`{"n":1}`))
				if keys > 0 {
					msg.Metadata.Set("key", strconv.FormatInt(i%int64(keys), 10))
				}
				if err := pub.Publish("orders", msg); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d messages handled", len(seen), n)
	}
	// Completed: the handler's last run is followed by its completion.
	for {
		sts, err := store.PendingStatus(context.Background())
		require.NoError(b, err)
		if len(sts) == 0 || sts[0].Pending == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msg/s")
	b.ReportMetric(float64(counter.Count("")-before)/float64(n), "stmts/msg")
	b.ReportMetric(0, "ns/op")
}
