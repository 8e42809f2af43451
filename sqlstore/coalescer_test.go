package sqlstore

import (
	"context"
	"errors"
	"reflect"
	"sync"
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

func TestCoalescerSurvivesAPanickingStatement(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	c := newCoalescer(1, 1000,
		func(_ context.Context, arg int) error {
			if arg == 0 { // the call in flight holds the slot until released
				close(entered)
				<-release
			}
			return nil
		},
		func(context.Context, []*call[int]) { panic("driver bug") },
	)
	queued := make(chan int, 64) // more than the changes of state this test makes
	c.observe = func(_, n int) { queued <- n }
	first := make(chan error, 1)
	go func() { first <- c.do(context.Background(), 0, 1) }()
	<-entered
	var errs [2]chan error
	panicked := make(chan any, 1)
	for i := range errs {
		errs[i] = make(chan error, 1)
		go func() {
			defer func() {
				if p := recover(); p != nil {
					panicked <- p
					errs[i] <- nil
				}
			}()
			errs[i] <- c.do(context.Background(), 1, 1)
		}()
	}
	for n := 0; n < 2; n = <-queued {
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	got := []error{<-errs[0], <-errs[1]}
	if p := <-panicked; p != "driver bug" {
		t.Errorf("the panic reaches the goroutine that ran the statement, got %v", p)
	}
	var failed int
	for _, err := range got {
		if errors.Is(err, ErrStatementPanicked) {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("the other call of the batch fails with ErrStatementPanicked: %v", got)
	}
	if err := c.do(context.Background(), 2, 1); err != nil {
		t.Errorf("the store still works after the panic: %v", err)
	}
}

// TestFewCallersForgetsAPeakAfterTwoWindows: a moment of many callers turns
// inserts alone off for the rest of its window and the next one, then they
// come back.
func TestFewCallersForgetsAPeakAfterTwoWindows(t *testing.T) {
	t.Parallel()
	c := newCoalescer(1, 1000, func(context.Context, int) error { return nil }, func(context.Context, []*call[int]) {})
	c.fewCallers = 4
	few := func() bool { return max(c.windowPeak, c.lastPeak) <= c.fewCallers }
	c.running = 9 // a burst: nine calls in flight
	c.count()
	c.running = 0
	if few() {
		t.Fatal("a call that found nine others did not turn it off")
	}
	for range window - 1 { // the rest of the burst's window
		c.count()
	}
	if few() {
		t.Fatal("the next window forgot the burst")
	}
	for range window - 1 {
		c.count()
	}
	if few() {
		t.Fatal("the window after the burst's ended early")
	}
	c.count()
	if !few() {
		t.Fatalf("two windows of one caller did not turn it back on (peaks %d, %d)", c.windowPeak, c.lastPeak)
	}
}

// TestDoAllRunsCallsThatArriveTogetherAsOneStatement: calls handed over
// together go as one statement when the store is idle, in chunks of
// maxItems; behind a statement in flight they wait and join the calls
// queued with them.
func TestDoAllRunsCallsThatArriveTogetherAsOneStatement(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var statements [][]int
	entered, release := make(chan struct{}), make(chan struct{})
	c := newCoalescer(1, 3,
		func(_ context.Context, arg int) error {
			if arg < 0 { // the call in flight holds the slot until released
				close(entered)
				<-release
			}
			mu.Lock()
			defer mu.Unlock()
			statements = append(statements, []int{arg})
			return nil
		},
		func(_ context.Context, batch []*call[int]) {
			mu.Lock()
			defer mu.Unlock()
			var args []int
			for _, cl := range batch {
				args = append(args, cl.arg)
			}
			statements = append(statements, args)
		},
	)
	errs := c.doAll(context.Background(), []int{1, 2, 3, 4, 5})
	if want := [][]int{{1, 2, 3}, {4, 5}}; !reflect.DeepEqual(statements, want) {
		t.Fatalf("idle: statements %v, want %v", statements, want)
	}
	if !reflect.DeepEqual(errs, make([]error, 5)) {
		t.Fatalf("idle: outcomes %v", errs)
	}

	statements = nil
	queued := make(chan int, 64) // more than the changes of state this test makes
	c.observe = func(_, n int) { queued <- n }
	first := make(chan error, 1)
	go func() { first <- c.do(context.Background(), -1, 1) }()
	<-entered
	other := make(chan error, 1)
	go func() { other <- c.do(context.Background(), 10, 1) }()
	for n := 0; n < 1; n = <-queued {
	}
	all := make(chan []error, 1)
	go func() { all <- c.doAll(context.Background(), []int{11, 12, 13}) }()
	for n := 0; n < 4; n = <-queued {
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}
	errs = <-all
	if want := [][]int{{-1}, {10, 11, 12}, {13}}; !reflect.DeepEqual(statements, want) {
		t.Errorf("behind a statement: %v, want %v", statements, want)
	}
	if want := []error{nil, nil, nil}; !reflect.DeepEqual(errs, want) {
		t.Errorf("behind a statement: outcomes %v, want %v", errs, want)
	}
}
