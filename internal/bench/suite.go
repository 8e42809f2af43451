package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

var oneByOne = sqlstore.Coalescing{DisableInsert: true, DisableComplete: true}

// coalesced is the store configuration of the default cases.
func (o options) coalesced() sqlstore.Coalescing { return sqlstore.Coalescing{MaxInFlight: o.inFlight} }

// insertsCoalesced is the default configuration with completions one by
// one.
func (o options) insertsCoalesced() sqlstore.Coalescing {
	co := o.coalesced()
	co.DisableComplete = true
	return co
}

// runRouterSuite measures what the outbox costs a message it does not track,
// with no database involved.
func runRouterSuite(ctx context.Context, o options) (*report, error) {
	rep := &report{}
	pubAllocs, deliveryAllocs, err := untrackedAllocs()
	if err != nil {
		return nil, err
	}
	rep.atMost("untracked publish through the decorator: 0 allocs/op", pubAllocs, 0, "%.0f allocs/op")
	rep.atMost("untracked delivery through the middleware: 0 allocs/op", deliveryAllocs, 0, "%.0f allocs/op")
	const publishers = 4
	ro := o
	ro.duration = o.routerDuration
	rs, err := sideBySide(o.routerRounds,
		func() (result, error) { return endToEnd(ctx, barePipeline(), openLoad(publishers, ro)) },
		func() (result, error) {
			p, err := untrackedPipeline()
			if err != nil {
				return result{}, err
			}
			return endToEnd(ctx, p, openLoad(publishers, ro))
		},
	)
	if err != nil {
		return nil, err
	}
	rep.add("router", "bare router + GoChannel", publishers, rs[0], "msg/s")
	rep.add("router", "untracked through decorator + middleware", publishers, rs[1], "msg/s")
	rep.ratio("untracked end to end ≥ 0.97× bare router", rs[1], rs[0], 0.97)
	return rep, nil
}

func untrackedAllocs() (publish, delivery float64, err error) {
	reg, err := untrackedRegistry()
	if err != nil {
		return 0, 0, err
	}
	pub, err := outbox.NewPublisher(reg, discard{})
	if err != nil {
		return 0, 0, err
	}
	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	if err != nil {
		return 0, 0, err
	}
	h := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msgs := []*message.Message{benchMessage()}
	publish = testing.AllocsPerRun(1000, func() { _ = pub.Publish("audit", msgs...) })
	delivery = testing.AllocsPerRun(1000, func() { _, _ = h(msgs[0]) })
	return publish, delivery, nil
}

// runSuite measures everything that needs the database, side by side.
func runSuite(ctx context.Context, d *database, o options) (*report, error) {
	rep := &report{costColumns: d.costColumns()}
	steps := []struct {
		group string
		run   func(context.Context, *database, options, *report) error
	}{
		{"publish", publishSteps}, {"batch", batchSteps}, {"latency-bound", endToEndSteps}, {"saturated", saturatedSteps}, {"ordered", orderedSteps}, {"remote", remoteSteps}, {"paced", pacedSteps}, {"replay", replaySteps},
		{"scale", scaleSteps},
	}
	for _, step := range steps {
		if !o.runs(step.group) {
			continue
		}
		if err := step.run(ctx, d, o, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

func publishSteps(ctx context.Context, d *database, o options, rep *report) error {
	def, err := d.defaultInFlight(o)
	if err != nil {
		return err
	}
	// The two other settings of MaxInFlight among 1, 2 and 4, to show what
	// the default trades.
	var others []sqlstore.Coalescing
	for _, k := range []int{1, 2, 4} {
		if k != def && len(others) < 2 {
			others = append(others, sqlstore.Coalescing{MaxInFlight: k})
		}
	}
	for _, w := range o.publisherCounts() {
		rs, err := sideBySide(o.rounds,
			func() (result, error) { return rawInsert(ctx, d, w, o.duration) },
			func() (result, error) { return trackedPublish(ctx, d, w, 1, o.coalesced(), o.duration) },
			func() (result, error) { return trackedPublish(ctx, d, w, 1, oneByOne, o.duration) },
			func() (result, error) { return trackedPublish(ctx, d, w, 1, others[0], o.duration) },
			func() (result, error) { return trackedPublish(ctx, d, w, 1, others[1], o.duration) },
		)
		if err != nil {
			return err
		}
		rep.add("publish", "raw single-row INSERT loop", w, rs[0], "rows/s")
		rep.add("publish", fmt.Sprintf("tracked publish, coalescing (default: MaxInFlight %d)", def), w, rs[1], "msg/s")
		rep.add("publish", "tracked publish, coalescing off", w, rs[2], "msg/s")
		for i, co := range others {
			rep.add("publish", fmt.Sprintf("tracked publish, coalescing, MaxInFlight %d", co.MaxInFlight), w, rs[3+i], "msg/s")
		}
		want := 0.9
		if w == 16 {
			want = 2
		}
		rep.ratio(fmt.Sprintf("tracked publish at %d ≥ %.1f× raw INSERT loop", w, want), rs[1], rs[0], want)
	}
	return nil
}

func batchSteps(ctx context.Context, d *database, o options, rep *report) error {
	const n = 100
	rs, err := sideBySide(o.rounds,
		func() (result, error) { return rawBatchInsert(ctx, d, n, o.duration) },
		func() (result, error) { return trackedPublish(ctx, d, 1, n, o.coalesced(), o.duration) },
	)
	if err != nil {
		return err
	}
	rep.add("publish 100", "raw 100-row INSERT", 1, rs[0], "rows/s")
	rep.add("publish 100", "tracked Publish of 100 messages", 1, rs[1], "msg/s")
	rep.ratio("Publish of 100 ≥ 0.7× raw 100-row INSERT", rs[1], rs[0], 0.7)
	return nil
}

// endToEndSteps is the latency-bound case: each publisher is at most
// o.window messages ahead of its handler, so that a system's throughput is
// bounded by how soon it delivers. Against the forwarder, which delivers
// once per poll, the ratio measures the window: about window messages per
// publisher per poll interval. The saturated case (saturatedSteps) is the
// comparison of throughput.
func endToEndSteps(ctx context.Context, d *database, o options, rep *report) error {
	classic := d.hasForwarder()
	group := fmt.Sprintf("latency-bound, ≤ %d in flight per publisher", o.window)
	for _, p := range o.publisherCounts() {
		cases := []func() (result, error){
			func() (result, error) { return rawCycle(ctx, d, p, o.duration) },
			func() (result, error) { return trackedEndToEnd(ctx, d, p, o.coalesced(), o) },
		}
		if p == 16 {
			cases = append(cases, func() (result, error) { return trackedEndToEnd(ctx, d, p, o.insertsCoalesced(), o) })
		}
		if classic {
			cases = append(cases, func() (result, error) {
				pl, err := classicPipeline(ctx, d, defaultPoll)
				if err != nil {
					return result{}, err
				}
				return endToEnd(ctx, pl, openLoad(p, o))
			})
		}
		rs, err := sideBySide(o.rounds, cases...)
		if err != nil {
			return err
		}
		rep.add(group, "raw SQL cycle (INSERT, SELECT by id, UPDATE), one at a time per writer", p, rs[0], "cycles/s")
		rep.add(group, "tracked, coalescing (default)", p, rs[1], "msg/s")
		if p == 16 {
			rep.add(group, "tracked, completions not coalesced", p, rs[2], "msg/s")
		}
		if classic {
			rep.add(group, "classic outbox (watermill-sql + forwarder, 1 s poll)", p, rs[len(rs)-1], "msg/s")
		}
		switch p {
		case 4:
			what := fmt.Sprintf("latency-bound at 4 (≤ %d in flight) ≥ 1.5× forwarder, 1 s poll: measures the window", o.window)
			if classic {
				rep.ratio(what, rs[1], rs[len(rs)-1], 1.5)
			} else {
				rep.notApplicable(what, noForwarder)
			}
			rep.ratio(fmt.Sprintf("latency-bound at 4 (≤ %d in flight) ≥ 1.0× raw SQL cycle", o.window), rs[1], rs[0], 1.0)
		case 16:
			rep.ratio(fmt.Sprintf("latency-bound at 16 (≤ %d in flight), completion coalescing ≥ 1.3× without", o.window), rs[1], rs[2], 1.3)
		}
	}
	return nil
}

// forwarderPolls are the poll intervals the forwarder runs with in the
// saturated case: watermill-sql's default and two shorter ones.
var forwarderPolls = []time.Duration{defaultPoll, 100 * time.Millisecond, 10 * time.Millisecond}

// saturatedSteps is the throughput case: each publisher sends
// o.saturatedN messages as fast as Publish returns, with no cap on messages
// in flight, into a no-op handler; the rate counts until the last message
// is handled. Compared side by side: Watermill's forwarder at each poll
// interval, the outbox's statements written by hand, and the project with
// its defaults.
func saturatedSteps(ctx context.Context, d *database, o options, rep *report) error {
	def, err := d.defaultInFlight(o)
	if err != nil {
		return err
	}
	group := "saturated, no cap in flight"
	project := fmt.Sprintf("project, defaults (MaxInFlight %d)", def)
	hand := "hand loop (INSERT … RETURNING; SELECT by id, UPDATE)"
	inserts := "project, inserts one by one (Coalescing.DisableInsert)"
	alone := "project, inserts alone below 4 (Coalescing.InsertsAloneBelow 4)"
	shortWait := "project, completions gathered for 5 ms (Complete.BatchWait 5 ms)"
	marking := "project, completed records kept (Completion: Mark)"
	checked := "project, checked path (CompleteBeforeAck + CheckFirstCopies)"
	markingChecked := "project, Completion: Mark + checked path"
	fwdName := func(poll time.Duration) string {
		return fmt.Sprintf("forwarder (watermill-sql, tx per publish), %s poll", pollText(poll))
	}
	checkedPath := outbox.MiddlewareConfig{Check: outbox.CheckConfig{FirstCopies: true}, Complete: outbox.CompleteConfig{BeforeAck: true}}
	for _, p := range o.publisherCounts() {
		l := saturatedLoad(p, o)
		l.meter = d.newMeter()
		// Each Publish call is timed too: the note says whether a system
		// was bound by its publishers.
		tracked := func(co sqlstore.Coalescing, mode sqlstore.Completion, cfg outbox.MiddlewareConfig) func() (result, error) {
			return func() (result, error) {
				pl, err := trackedPipelineWith(ctx, d, p, co, mode, cfg)
				if err != nil {
					return result{}, err
				}
				return timedEndToEnd(ctx, pl, l)
			}
		}
		oneByOne, fewAlone := o.coalesced(), o.coalesced()
		oneByOne.DisableInsert = true
		fewAlone.InsertsAloneBelow = 4
		cases := []func() (result, error){
			tracked(o.coalesced(), sqlstore.Delete, outbox.MiddlewareConfig{}),
			func() (result, error) {
				pl, err := handPipeline(ctx, d)
				if err != nil {
					return result{}, err
				}
				return timedEndToEnd(ctx, pl, l)
			},
			tracked(oneByOne, sqlstore.Delete, outbox.MiddlewareConfig{}),
			tracked(fewAlone, sqlstore.Delete, outbox.MiddlewareConfig{}),
			tracked(o.coalesced(), sqlstore.Mark, outbox.MiddlewareConfig{}),
			tracked(o.coalesced(), sqlstore.Delete, checkedPath),
			tracked(o.coalesced(), sqlstore.Mark, checkedPath),
			tracked(o.coalesced(), sqlstore.Delete, outbox.MiddlewareConfig{Complete: outbox.CompleteConfig{BatchWait: 5 * time.Millisecond}}),
		}
		if d.hasForwarder() {
			for _, poll := range forwarderPolls {
				cases = append(cases, func() (result, error) {
					pl, err := classicPipeline(ctx, d, poll)
					if err != nil {
						return result{}, err
					}
					return timedEndToEnd(ctx, pl, l)
				})
			}
		}
		rs, err := sideBySide(o.saturatedRounds, cases...)
		if err != nil {
			return err
		}
		for i := range rs {
			rs[i].latency = false // queueing, not the systems': the paced case measures latency
		}
		rep.add(group, project, p, rs[0], "msg/s")
		rep.add(group, hand, p, rs[1], "msg/s")
		rep.add(group, inserts, p, rs[2], "msg/s")
		rep.add(group, alone, p, rs[3], "msg/s")
		rep.add(group, marking, p, rs[4], "msg/s")
		rep.add(group, checked, p, rs[5], "msg/s")
		rep.add(group, markingChecked, p, rs[6], "msg/s")
		rep.add(group, shortWait, p, rs[7], "msg/s")
		const forwarders = 8
		for i, poll := range forwarderPolls {
			if d.hasForwarder() {
				fwd := rs[forwarders+i]
				rep.add(group, fwdName(poll), p, fwd, "msg/s")
				rep.compare(fmt.Sprintf("saturated at %d: project / forwarder, %s poll", p, pollText(poll)), rs[0], fwd)
			}
		}
		if d.hasForwarder() {
			costTargets(rep, p, rs[0], rs[forwarders:])
		}
		rep.compare(fmt.Sprintf("saturated at %d: inserts one by one / defaults", p), rs[2], rs[0])
		rep.compare(fmt.Sprintf("saturated at %d: defaults / inserts alone below 4", p), rs[0], rs[3])
		rep.compareCost(fmt.Sprintf("saturated at %d: DB CPU ms per message, defaults / BatchWait 5 ms", p), "cpu", rs[0], rs[7])
		if !d.hasForwarder() {
			rep.compareNotApplicable(fmt.Sprintf("saturated at %d: project / forwarder", p), noForwarder)
		}
		rep.compare(fmt.Sprintf("saturated at %d: project / hand loop", p), rs[0], rs[1])
	}
	return nil
}

// pollText writes a poll interval as the docs do: "1 s", "100 ms".
func pollText(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%d s", d/time.Second)
	}
	return fmt.Sprintf("%d ms", d/time.Millisecond)
}

func trackedEndToEnd(ctx context.Context, d *database, publishers int, co sqlstore.Coalescing, o options) (result, error) {
	return trackedEndToEndLoad(ctx, d, publishers, co, openLoad(publishers, o))
}

func trackedEndToEndLoad(ctx context.Context, d *database, publishers int, co sqlstore.Coalescing, l load) (result, error) {
	p, err := trackedPipeline(ctx, d, publishers, co)
	if err != nil {
		return result{}, err
	}
	return endToEnd(ctx, p, l)
}

func pacedSteps(ctx context.Context, d *database, o options, rep *report) error {
	p, err := trackedPipeline(ctx, d, 1, o.coalesced())
	if err != nil {
		return err
	}
	tracked, err := endToEnd(ctx, p, pacedLoad(o))
	if err != nil {
		return err
	}
	group := fmt.Sprintf("paced %d msg/s", o.pacedRate)
	rep.add(group, "tracked", 1, tracked, "msg/s")
	if d.hasForwarder() {
		pl, err := classicPipeline(ctx, d, defaultPoll)
		if err != nil {
			return err
		}
		classic, err := endToEnd(ctx, pl, pacedLoad(o))
		if err != nil {
			return err
		}
		rep.add(group, "classic outbox (watermill-sql + forwarder, 1 s poll)", 1, classic, "msg/s")
	}
	rep.atMost(fmt.Sprintf("paced %d msg/s: p50 publish → handler ≤ 1 ms", o.pacedRate), ms64(tracked.p50), 1, "%.2f ms")
	rep.atMost(fmt.Sprintf("paced %d msg/s: p99 publish → handler ≤ 5 ms", o.pacedRate), ms64(tracked.p99), 5, "%.2f ms")
	return nil
}

func ms64(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func replaySteps(ctx context.Context, d *database, o options, rep *report) error {
	rr, err := replayCase(ctx, d, o.replayRows)
	if err != nil {
		return err
	}
	rr.result.note = fmt.Sprintf("bulk load %v; first message delivered after %v; peak heap +%.1f MiB",
		rr.load.Round(time.Millisecond), rr.firstDelivery.Round(time.Microsecond), float64(rr.heapGrowth)/mib)
	if rr.rssMeasured {
		rr.result.note += fmt.Sprintf(", peak RSS +%.1f MiB", float64(rr.rssGrowth)/mib)
	}
	rep.add("replay", fmt.Sprintf("replay of %d pending rows into GoChannel", rr.rows), 0, rr.result, "rows/s")
	rep.atLeast(fmt.Sprintf("replay of %d rows ≥ 50,000 rows/s", rr.rows), rr.result.rate, 50_000, "%.0f rows/s")
	growth := rr.heapGrowth
	what := "heap"
	if rr.rssMeasured {
		growth, what = max(rr.heapGrowth, rr.rssGrowth), "heap and RSS"
	}
	rep.atMost(fmt.Sprintf("replay peak memory growth (%s) ≤ 100 MiB", what), float64(growth)/mib, 100, "%.1f MiB")
	return nil
}

// costTargets checks the cost targets of the saturated case at one
// publisher count: each project case against the forwarder at its best
// for that figure (the lowest cost, the highest rate, among its polls that
// lost no message).
func costTargets(rep *report, publishers int, project result, forwarders []result) {
	best := func(key string, better func(a, b float64) bool) float64 {
		v, found := 0.0, false
		for _, f := range forwarders {
			if f.lost > 0 {
				// A poll that lost messages is no baseline.
				continue
			}
			x := f.cost[key]
			if key == "rate" {
				x = f.rate
			}
			if !found || better(x, v) {
				v, found = x, true
			}
		}
		return v
	}
	lower := func(a, b float64) bool { return a < b }
	cpu, wal, rate := best("cpu", lower), best("wal", lower), best("rate", func(a, b float64) bool { return a > b })
	if project.cost == nil || cpu == 0 || wal == 0 || rate == 0 {
		return
	}
	at := fmt.Sprintf("saturated at %d, project defaults", publishers)
	rep.atMost(at+": DB CPU/msg ≤ 0.7× the forwarder's lowest", project.cost["cpu"]/cpu, 0.7, "%.2f×")
	rep.atMost(at+": WAL/msg ≤ 0.9× the forwarder's lowest", project.cost["wal"]/wal, 0.9, "%.2f×")
	rep.atMost(at+": rows read/msg ≤ 10", project.cost["read"], 10, "%.1f")
	rep.atLeast(at+": msg/s ≥ 1.3× the forwarder's highest", project.rate/rate, 1.3, "%.2f×")
}
