package outbox_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// The benchmarks of the tracked hot paths run on every database; their
// figures are round trips, and allocs/op is what the outbox adds to them.

func benchBundle(b *testing.B, backend testenv.Backend) (*sqlstore.Store, *outbox.Registry) {
	b.Helper()
	db := backend.Open(b)
	store := testenv.NewStore(b, backend, db, sqlstore.Mark)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	require.NoError(b, err)
	return store, reg
}

func forEachBackendB(b *testing.B, fn func(b *testing.B, backend testenv.Backend)) {
	for _, backend := range testenv.Backends() {
		b.Run(backend.Name, func(b *testing.B) { fn(b, backend) })
	}
}

// BenchmarkTrackedPublish is one message per Publish: one INSERT.
func BenchmarkTrackedPublish(b *testing.B) {
	forEachBackendB(b, func(b *testing.B, backend testenv.Backend) {
		_, reg := benchBundle(b, backend)
		pub, err := outbox.NewPublisher(reg, discardPublisher{})
		require.NoError(b, err)
		b.ReportAllocs()
		for b.Loop() {
			if err := pub.Publish("orders", message.NewMessage("uuid", []byte("payload"))); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkTrackedPublishParallel publishes from many goroutines, so that
// inserts are coalesced.
func BenchmarkTrackedPublishParallel(b *testing.B) {
	forEachBackendB(b, func(b *testing.B, backend testenv.Backend) {
		_, reg := benchBundle(b, backend)
		pub, err := outbox.NewPublisher(reg, discardPublisher{})
		require.NoError(b, err)
		b.SetParallelism(8)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := pub.Publish("orders", message.NewMessage("uuid", []byte("payload"))); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkTrackedDelivery is the middleware on a pending record: the check,
// the handler and the completion.
func BenchmarkTrackedDelivery(b *testing.B) {
	forEachBackendB(b, func(b *testing.B, backend testenv.Backend) {
		store, reg := benchBundle(b, backend)
		mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
		require.NoError(b, err)
		h := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		records := make([]recordstore.Record, b.N)
		for i := range records {
			records[i] = recordstore.Record{Topic: "orders", UUID: strconv.Itoa(i), Payload: []byte("payload")}
		}
		for start := 0; start < len(records); start += 1000 {
			require.NoError(b, store.Insert(context.Background(), records[start:min(start+1000, len(records))]))
		}
		// The table identity makes the messages this service's: without it
		// they would run untracked, touching no table.
		identity, err := store.Identity(context.Background())
		require.NoError(b, err)
		msgs := make([]*message.Message, b.N)
		for i, r := range records {
			msgs[i] = message.NewMessage(r.UUID, r.Payload)
			msgs[i].Metadata.Set(outbox.MetadataID, strconv.FormatInt(r.ID, 10))
			msgs[i].Metadata.Set(outbox.MetadataTopic, "orders")
			msgs[i].Metadata.Set(outbox.MetadataTable, identity)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := h(msgs[i]); err != nil {
				b.Fatal(err)
			}
		}
		require.NoError(b, reg.WaitCompletions(context.Background()))
		b.StopTimer()
		// Every delivery was tracked: no record is pending any more.
		pending, err := store.PendingAfter(context.Background(), "orders", 0, 1)
		require.NoError(b, err)
		require.Empty(b, pending, "a delivery left its record pending")
	})
}

// BenchmarkReplay is the cost of replaying one pending record: an op is one
// record, read in pages and sent.
func BenchmarkReplay(b *testing.B) {
	forEachBackendB(b, func(b *testing.B, backend testenv.Backend) {
		store, reg := benchBundle(b, backend)
		records := make([]recordstore.Record, b.N)
		for i := range records {
			records[i] = recordstore.Record{Topic: "orders", UUID: strconv.Itoa(i), Payload: []byte("payload"),
				Metadata: message.Metadata{"trace": "abc"}}
		}
		require.NoError(b, store.Insert(context.Background(), records))
		b.ReportAllocs()
		b.ResetTimer()
		res, err := outbox.Replay(context.Background(), reg, discardPublisher{}, outbox.ReplayConfig{}, nil)
		require.NoError(b, err)
		require.Equal(b, b.N, res.Total())
	})
}
