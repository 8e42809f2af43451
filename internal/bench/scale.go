package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/sqlstore"
)

// scalePublishers is the publisher count of the scale case's saturated
// measure.
const scalePublishers = 4

// scaleSteps measures what a table of o.scaleRows completed records costs
// the outbox, against an empty table: the saturated rate at
// scalePublishers, and the paced latency; then the Cleaner deleting those
// records, and the paced latency while it runs against the same publisher
// with no Cleaner (idle). The empty table is a new one each round; the full
// one is filled once and measured in the same rounds, interleaved.
func scaleSteps(ctx context.Context, d *database, o options, rep *report) error {
	full, err := d.newStoreOf(ctx, o.coalesced(), sqlstore.Mark)
	if err != nil {
		return err
	}
	defer d.drop(ctx, full)
	start := time.Now()
	if err := fillTable(ctx, d, full, fill{rows: o.scaleRows, topics: topics(scalePublishers), completed: true}); err != nil {
		return err
	}
	filled := time.Since(start)
	group := fmt.Sprintf("scale, %d completed records", o.scaleRows)

	l := saturatedLoad(scalePublishers, o)
	sat, err := sideBySide(o.saturatedRounds,
		func() (result, error) {
			p, err := trackedPipelineOf(ctx, d, scalePublishers, o.coalesced(), sqlstore.Mark)
			if err != nil {
				return result{}, err
			}
			return endToEnd(ctx, p, l)
		},
		func() (result, error) {
			p, err := storePipeline(full, scalePublishers, func() {})
			if err != nil {
				return result{}, err
			}
			return endToEnd(ctx, p, l)
		},
	)
	if err != nil {
		return err
	}
	for i := range sat {
		sat[i].latency = false // queueing: the paced rows measure latency
	}
	sat[1].note = fmt.Sprintf("table filled in %v", filled.Round(time.Millisecond))
	rep.add(group, "saturated, empty table", scalePublishers, sat[0], "msg/s")
	rep.add(group, "saturated, full table", scalePublishers, sat[1], "msg/s")
	rep.compare(fmt.Sprintf("scale: saturated at %d, full / empty table", scalePublishers), sat[1], sat[0])

	paced, err := sideBySideBy(o.saturatedRounds, byP99,
		func() (result, error) {
			p, err := trackedPipelineOf(ctx, d, 1, o.coalesced(), sqlstore.Mark)
			if err != nil {
				return result{}, err
			}
			return timedEndToEnd(ctx, p, pacedLoad(o))
		},
		func() (result, error) {
			p, err := storePipeline(full, 1, func() {})
			if err != nil {
				return result{}, err
			}
			return timedEndToEnd(ctx, p, pacedLoad(o))
		},
	)
	if err != nil {
		return err
	}
	rep.add(group, fmt.Sprintf("paced %d msg/s, empty table", o.pacedRate), 1, paced[0], "msg/s")
	rep.add(group, fmt.Sprintf("paced %d msg/s, full table", o.pacedRate), 1, paced[1], "msg/s")
	rep.compareLatency("scale: paced p50 publish → handler, full / empty table", paced[1].p50, paced[0].p50)
	rep.compareLatency("scale: paced p99 publish → handler, full / empty table", paced[1].p99, paced[0].p99)
	rep.compareLatency("scale: paced p99 of the Publish call, full / empty table", paced[1].callP99, paced[0].callP99)

	cleaner, during, err := cleanerCase(ctx, d, full, o.scaleRows, o)
	if err != nil {
		return err
	}
	rep.add(group, fmt.Sprintf("Cleaner deleting the %d completed records, batches of %d, %s", o.scaleRows, defaultCleanerBatch, pauseText(o.cleanerPause)), 0, cleaner, "rows/s")
	rep.add(group, fmt.Sprintf("paced %d msg/s, full table, while the Cleaner runs", o.pacedRate), 1, during, "msg/s")
	rep.compareLatency("scale: paced p99 publish → handler, Cleaner running / idle", during.p99, paced[1].p99)
	rep.compareLatency("scale: paced p99 of the Publish call, Cleaner running / idle", during.callP99, paced[1].callP99)
	if d.name != "postgres" {
		return nil
	}
	return partitionedScaleSteps(ctx, d, o, rep)
}

// partitionedScaleSteps measures the Cleaner on a partitioned table
// (sqlstore.Config.PartitionEvery): o.partitionRows completed records in
// its first partition, the next one started; the paced latency on that
// table idle, then while the Cleaner drops the old partition.
func partitionedScaleSteps(ctx context.Context, d *database, o options, rep *report) error {
	full, err := d.newPartitionedStore(ctx, o.coalesced())
	if err != nil {
		return err
	}
	defer d.drop(ctx, full)
	start := time.Now()
	if err := fillTable(ctx, d, full, fill{rows: o.partitionRows, topics: topics(scalePublishers), completed: true}); err != nil {
		return err
	}
	filled := time.Since(start)
	if err := full.Rotate(ctx); err != nil {
		return err
	}
	group := fmt.Sprintf("scale, %d completed records in a partition (PartitionEvery)", o.partitionRows)
	idle, err := sideBySideBy(o.saturatedRounds, byP99, func() (result, error) {
		p, err := storePipeline(full, 1, func() {})
		if err != nil {
			return result{}, err
		}
		return timedEndToEnd(ctx, p, pacedLoad(o))
	})
	if err != nil {
		return err
	}
	idle[0].note += fmt.Sprintf("; table filled in %v", filled.Round(time.Millisecond))
	rep.add(group, fmt.Sprintf("paced %d msg/s, partitioned table", o.pacedRate), 1, idle[0], "msg/s")
	cleaner, during, err := cleanerCase(ctx, d, full, -1, o)
	if err != nil {
		return err
	}
	var left bool
	if err := d.db.GetContext(ctx, &left, "SELECT to_regclass($1) IS NOT NULL", full.Table()+"_p0"); err != nil || left {
		return fmt.Errorf("the Cleaner left the partition of the filled records (%v)", err)
	}
	rep.add(group, fmt.Sprintf("Cleaner dropping the partition of the %d completed records", o.partitionRows), 0, cleaner, "rows/s")
	rep.add(group, fmt.Sprintf("paced %d msg/s, partitioned table, while the Cleaner drops the partition", o.pacedRate), 1, during, "msg/s")
	rep.compareLatency("scale: paced p99 publish → handler, Cleaner dropping a partition / idle", during.p99, idle[0].p99)
	rep.compareLatency("scale: paced p99 of the Publish call, Cleaner dropping a partition / idle", during.callP99, idle[0].callP99)
	return nil
}

// pauseText says which CleanerConfig.Pause the Cleaner ran with.
func pauseText(p time.Duration) string {
	switch {
	case p == 0:
		return "default Pause"
	case p < 0:
		return "no Pause"
	}
	return fmt.Sprintf("Pause %v", p)
}

// defaultCleanerBatch is outboxops.CleanerConfig's default BatchSize, which the
// scale case runs with.
const defaultCleanerBatch = 1000

// cleanerCase runs the Cleaner, with its defaults (Pause included) but OlderThan, over the
// full table until it has deleted its rows filled records (any number when
// rows is negative: a dropped partition is counted as estimated), and a paced publisher
// on that table for its count of messages and for as long as it runs. It returns the Cleaner's rows per
// second and the paced publisher's latencies.
func cleanerCase(ctx context.Context, d *database, full *sqlstore.Store, rows int, o options) (cleaner, paced result, err error) {
	purging, closePool, err := d.writerStore(full)
	if err != nil {
		return result{}, result{}, err
	}
	defer closePool()
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topics(1)[0], Store: purging})
	if err != nil {
		return result{}, result{}, err
	}
	c, err := outboxops.NewCleaner(reg, outboxops.CleanerConfig{OlderThan: fillOlderThan, BatchSize: defaultCleanerBatch, Pause: o.cleanerPause}, nil)
	if err != nil {
		return result{}, result{}, err
	}
	p, err := storePipeline(full, 1, func() {})
	if err != nil {
		return result{}, result{}, err
	}
	cleanCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	var deleted, failed int
	var cleanErr, firstErr error
	var took time.Duration
	started := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-started:
		case <-cleanCtx.Done():
			cleanErr = cleanCtx.Err()
			return
		}
		start := time.Now()
		deleted, failed, firstErr, cleanErr = cleanAll(cleanCtx, c)
		took = time.Since(start)
	}()
	// The Cleaner starts with the paced publisher, which sends its count
	// and goes on until the Cleaner is done: a partition's drop takes a
	// moment, and the latencies around it are measured among as many
	// messages as the idle case's.
	l := pacedLoad(o)
	l.until, l.started = done, func() { close(started) }
	paced, err = timedEndToEnd(ctx, p, l)
	if err != nil {
		cancel()
	}
	<-done
	switch {
	case err != nil:
		return result{}, result{}, err
	case cleanErr != nil:
		return result{}, result{}, cleanErr
	case rows >= 0 && deleted != rows && failed == 0:
		return result{}, result{}, fmt.Errorf("the Cleaner deleted %d records of the %d filled", deleted, rows)
	}
	cleaner = result{rate: float64(deleted) / took.Seconds(), note: fmt.Sprintf("took %v", took.Round(time.Millisecond))}
	if purging != full {
		cleaner.note += "; on a pool of its own with _txlock=immediate"
	}
	if failed > 0 {
		// A batch whose commit failed is counted as deleted by Clean.
		cleaner.note += fmt.Sprintf("; %d cleanups failed and were run again at once (%d counted deleted), first: %v", failed, deleted, firstErr)
	}
	paced.note = fmt.Sprintf("%s; %d messages at least, and for as long as the Cleaner ran", paced.note, l.count)
	return cleaner, paced, nil
}

// maxCleanFailures ends cleanAll after that many failed cleanups in a row
// that deleted nothing.
const maxCleanFailures = 100

// cleanAll runs cleanups until one succeeds, which is once nothing old is
// left, and returns how many records they deleted. A failed cleanup is run
// again at once, as Cleaner.Run would at its next interval, and counted.
func cleanAll(ctx context.Context, c *outboxops.Cleaner) (deleted, failed int, first, err error) {
	for stuck := 0; ; {
		n, err := c.CleanOnce(ctx)
		deleted += n
		if err == nil {
			return deleted, failed, first, nil
		}
		if failed++; first == nil {
			first = err
		}
		if stuck = stuck + 1; n > 0 {
			stuck = 0
		}
		if stuck == maxCleanFailures || ctx.Err() != nil {
			return deleted, failed, first, fmt.Errorf("%d cleanups failed, %d in a row deleted nothing: %w", failed, stuck, err)
		}
	}
}

// timedEndToEnd is endToEnd with each Publish call timed as well.
func timedEndToEnd(ctx context.Context, p pipeline, l load) (result, error) {
	calls := &latencies{}
	tp := timedPublisher{Publisher: p.pub, calls: calls, last: &atomic.Int64{}}
	p.pub = tp
	r, err := endToEnd(ctx, p, l)
	if err != nil {
		return r, err
	}
	var ok bool
	if r.callP50, r.callP99, ok = calls.percentiles(); ok {
		r.note = fmt.Sprintf("Publish call p50 %s, p99 %s", ms(r.callP50), ms(r.callP99))
		if l.interval == 0 && l.duration == 0 { // saturated: did delivery keep up with the publishers?
			r.note += fmt.Sprintf("; last delivery %s after the last Publish returned", ms(r.lastHandled.Sub(time.Unix(0, tp.last.Load()))))
		}
	}
	return r, nil
}

// timedPublisher times each Publish call: with the outbox, the record's
// insert and the hand-off to GoChannel. last is when the latest call
// returned.
type timedPublisher struct {
	message.Publisher
	calls *latencies
	last  *atomic.Int64
}

func (t timedPublisher) Publish(topic string, msgs ...*message.Message) error {
	start := time.Now()
	err := t.Publisher.Publish(topic, msgs...)
	end := time.Now()
	t.calls.add(end.Sub(start))
	t.last.Store(end.UnixNano())
	return err
}
