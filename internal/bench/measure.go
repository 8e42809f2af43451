package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// result is one measured case.
type result struct {
	rate     float64 // units per second
	p50, p99 time.Duration
	latency  bool // p50 and p99 were measured
	errors   int64
	firstErr error
	// lost is how many published messages never reached the handler; the
	// rate is then over the handled ones, up to the last.
	lost int64
	// callP50 and callP99 are those of the Publish call alone, in the
	// cases that time it (timedPublisher).
	callP50, callP99 time.Duration
	// lastHandled is when the last message was handled, in the end-to-end
	// cases.
	lastHandled time.Time
	note        string
	// cost is what a delivered message cost the database, by
	// costColumn.key, in the cases that measure it (load.meter).
	cost map[string]float64
}

// loop runs workers that call op until d has passed and returns the units
// they did per second; op returns how many units one call did. A failing call
// is counted, not fatal, so that a database refusing work shows in the table.
func loop(ctx context.Context, workers int, d time.Duration, op func(ctx context.Context, worker int) (int, error)) result {
	var done, failed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				n, err := op(ctx, w)
				if err != nil {
					failed.Add(1)
					once.Do(func() { firstErr = err })
					continue
				}
				done.Add(int64(n))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	return result{rate: float64(done.Load()) / elapsed.Seconds(), errors: failed.Load(), firstErr: firstErr}
}

// sideBySide runs every case once per round, alternating them so that they
// see the same machine, and returns each case's median by rate. Each round
// starts with the next case, so that none always runs first.
func sideBySide(rounds int, cases ...func() (result, error)) ([]result, error) {
	return sideBySideBy(rounds, byRate, cases...)
}

// sideBySideBy is sideBySide with each case's median run chosen by key:
// byP99 for paced cases, whose rates are the pace.
func sideBySideBy(rounds int, key func(result) float64, cases ...func() (result, error)) ([]result, error) {
	runs := make([][]result, len(cases))
	for round := range rounds {
		for k := range cases {
			i := (round + k) % len(cases)
			r, err := cases[i]()
			if err != nil {
				return nil, err
			}
			runs[i] = append(runs[i], r)
		}
	}
	out := make([]result, len(cases))
	for i, rs := range runs {
		out[i] = median(rs, key)
	}
	return out, nil
}

func byRate(r result) float64 { return r.rate }

func byP99(r result) float64 { return float64(r.p99) }

// median is the run of rs in the middle by key, with each cost per message
// the median of the runs' own: a round's cost moves with what else the
// machine did then, and the round chosen by rate need not be the one in
// the middle by cost.
func median(rs []result, key func(result) float64) result {
	slices.SortFunc(rs, func(a, b result) int { return cmp.Compare(key(a), key(b)) })
	m := rs[len(rs)/2]
	if m.cost == nil {
		return m
	}
	cost := make(map[string]float64, len(m.cost))
	for k := range m.cost {
		var vs []float64
		for _, r := range rs {
			if v, ok := r.cost[k]; ok {
				vs = append(vs, v)
			}
		}
		slices.Sort(vs)
		cost[k] = vs[len(vs)/2]
	}
	m.cost = cost
	return m
}

// latencies collects publish-to-handler times from several goroutines.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, d)
	l.mu.Unlock()
}

func (l *latencies) into(r *result) {
	r.p50, r.p99, r.latency = l.percentiles()
}

// percentiles are the median and the 99th percentile; ok is false when
// nothing was measured.
func (l *latencies) percentiles() (p50, p99 time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.all) == 0 {
		return 0, 0, false
	}
	slices.Sort(l.all)
	return l.all[len(l.all)*50/100], l.all[min(len(l.all)*99/100, len(l.all)-1)], true
}

// errorsOf fails a case whose every operation failed: its figure would mean
// nothing.
func errorsOf(name string, r result) error {
	if r.rate == 0 && r.errors > 0 {
		return fmt.Errorf("%s: every operation failed: %w", name, r.firstErr)
	}
	if r.rate == 0 {
		return errors.New(name + ": nothing was done")
	}
	return nil
}
