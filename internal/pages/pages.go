// Package pages sizes the reads of records for a byte budget: a store that
// implements recordstore.ByteBoundedReader ends a page at the budget, and
// each read asks for about as many records as the last one showed the
// budget holds, so that the rows a store had to skip stay few. A read under
// the budget lets the next one ask for twice as many, up to the configured
// count.
package pages

import (
	"context"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// Reader sizes the reads of records for a byte budget: a store that
// implements [recordstore.ByteBoundedReader] ends a page at the budget,
// and each read asks for about as many records as the last one showed the
// budget holds, so that the rows a store had to skip stay few. A read under
// the budget lets the next one ask for twice as many, up to the
// configured count.
type Reader struct {
	maxRecords, maxBytes int
	limit                int
}

// New returns a Reader of at most maxRecords records and about maxBytes
// bytes a read.
func New(maxRecords, maxBytes int) *Reader {
	return &Reader{maxRecords: maxRecords, maxBytes: maxBytes, limit: maxRecords}
}

// Pending reads the next page of topic's pending records after after, and
// reports whether more may follow.
func (p *Reader) Pending(ctx context.Context, store recordstore.Store, topic string, after int64) ([]recordstore.Record, bool, error) {
	limit := p.limit
	var recs []recordstore.Record
	var err error
	if b, ok := store.(recordstore.ByteBoundedReader); ok {
		recs, err = b.PendingAfterBytes(ctx, topic, after, limit, p.maxBytes)
	} else {
		recs, err = store.PendingAfter(ctx, topic, after, limit)
	}
	if err != nil {
		return nil, false, err
	}
	return recs, p.adapt(recs, limit), nil
}

// Stale claims the next batch of topic's stale records after after, and
// reports whether more may follow.
func (p *Reader) Stale(ctx context.Context, claimer recordstore.StaleClaimer, topic string, after int64, olderThan time.Duration) ([]recordstore.Record, bool, error) {
	limit := p.limit
	var recs []recordstore.Record
	var err error
	if b, ok := claimer.(recordstore.ByteBoundedReader); ok {
		recs, err = b.ClaimStaleBytes(ctx, topic, after, olderThan, limit, p.maxBytes)
	} else {
		recs, err = claimer.ClaimStale(ctx, topic, after, olderThan, limit)
	}
	if err != nil {
		return nil, false, err
	}
	return recs, p.adapt(recs, limit), nil
}

// Spaced claims the next batch of topic's records whose resends are
// spaced ([recordstore.SpacedClaimer]), and reports whether more may follow.
func (p *Reader) Spaced(ctx context.Context, claimer recordstore.SpacedClaimer, topic string, after int64, minAge, maxAge time.Duration) ([]recordstore.Record, bool, error) {
	limit := p.limit
	recs, err := claimer.ClaimSpaced(ctx, topic, after, minAge, maxAge, limit, p.maxBytes)
	if err != nil {
		return nil, false, err
	}
	return recs, p.adapt(recs, limit), nil
}

// Replay claims the next page of topic's records for a replay by claims:
// with [recordstore.ReplayClaimer], those never sent again after their
// publish too; with a bare [recordstore.StaleClaimer], the stale ones.
func (p *Reader) Replay(ctx context.Context, claimer recordstore.StaleClaimer, topic string, after int64, grace time.Duration) ([]recordstore.Record, bool, error) {
	rc, ok := claimer.(recordstore.ReplayClaimer)
	if !ok {
		return p.Stale(ctx, claimer, topic, after, grace)
	}
	limit := p.limit
	recs, err := rc.ClaimReplay(ctx, topic, after, grace, limit, p.maxBytes)
	if err != nil {
		return nil, false, err
	}
	return recs, p.adapt(recs, limit), nil
}

// adapt sets the next read's limit from the records of a read that asked
// for asked, and reports whether more records may follow it.
func (p *Reader) adapt(recs []recordstore.Record, asked int) bool {
	bytes, fit := 0, len(recs)
	for i := range recs {
		if bytes += recs[i].Size(); bytes >= p.maxBytes {
			fit = i + 1
			break
		}
	}
	if bytes >= p.maxBytes {
		p.limit = max(1, fit)
		return true
	}
	p.limit = min(p.maxRecords, 2*p.limit)
	return len(recs) == asked
}
