package sqlstore

import (
	"context"
	"testing"
)

func TestBatchContextIsDoneWhenEveryCallGaveUp(t *testing.T) {
	t.Parallel()
	type key struct{}
	first, cancelFirst := context.WithCancel(context.WithValue(context.Background(), key{}, "first"))
	second, cancelSecond := context.WithCancel(context.Background())
	defer cancelSecond()
	ctx, stop := batchContext([]*call[int]{{ctx: first}, {ctx: second}})
	defer stop()

	if ctx.Value(key{}) != "first" {
		t.Error("the batch context keeps the first call's values")
	}
	cancelFirst()
	select {
	case <-ctx.Done():
		t.Fatal("one caller giving up cancelled the batch of another")
	default:
	}
	cancelSecond()
	<-ctx.Done() // the test times out if the batch is never cancelled
	if ctx.Err() == nil {
		t.Error("done without an error")
	}
}

// BenchmarkCoalescer is what the coalescer adds to a call, with a statement
// that costs nothing: alone (the store is idle), and from many goroutines
// (calls wait and are handed off in batches).
func BenchmarkCoalescer(b *testing.B) {
	one := func(context.Context, int) error { return nil }
	many := func(context.Context, []*call[int]) {}
	b.Run("Alone", func(b *testing.B) {
		c := newCoalescer(1, 1000, one, many)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if err := c.do(ctx, 1, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Contended", func(b *testing.B) {
		c := newCoalescer(1, 1000, one, many)
		b.SetParallelism(8)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if err := c.do(ctx, 1, 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
