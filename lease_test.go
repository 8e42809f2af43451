package outbox_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
)

func TestLease(t *testing.T) {
	t.Parallel()

	t.Run("SecondCopyIsNackedWhileTheFirstRuns", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b, inst, _ := instances(t, backend, 2, time.Minute)
			msg := b.publishTracked(t, 1)[0]
			running, finish := make(chan struct{}), make(chan struct{})
			first := &recordingHandler{seen: func(*message.Message) { close(running); <-finish }}
			second := &recordingHandler{}

			done := make(chan error, 1)
			go func() {
				_, err := inst[0].mw(first.handle)(msg.Copy())
				done <- err
			}()
			<-running
			_, err := inst[1].mw(second.handle)(msg.Copy())
			var leased *outbox.CheckError
			require.ErrorAs(t, err, &leased, "the copy is nacked while the first delivery holds the lease")
			assert.ErrorIs(t, err, recordstore.ErrLeased)
			close(finish)
			require.NoError(t, <-done)

			_, err = inst[1].mw(second.handle)(msg.Copy())
			require.NoError(t, err, "the redelivery after completion is acked")
			assert.EqualValues(t, 1, first.runs.Load())
			assert.Zero(t, second.runs.Load(), "the second copy never ran the handler")
		})
	})

	t.Run("FailedHandlerReleasesTheLease", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b, inst, _ := instances(t, backend, 2, time.Hour)
			msg := b.publishTracked(t, 1)[0]
			failing := &recordingHandler{err: errors.New("try later")}
			_, err := inst[0].mw(failing.handle)(msg.Copy())
			require.Error(t, err)
			ok := &recordingHandler{}
			_, err = inst[1].mw(ok.handle)(msg.Copy())
			require.NoError(t, err, "the redelivery claims the record at once, not after an hour")
			assert.EqualValues(t, 1, ok.runs.Load())
		})
	})
}

// overlapDetector is a handler that notices when two runs of one record are
// in it at the same time.
type overlapDetector struct {
	inflight sync.Map // record id -> *atomic.Int32
	runs     atomic.Int64
	overlaps atomic.Int64
}

func (o *overlapDetector) handle(msg *message.Message) error {
	ref, _ := outbox.RecordFromContext(msg.Context())
	c, _ := o.inflight.LoadOrStore(ref.ID, new(atomic.Int32))
	n := c.(*atomic.Int32)
	if n.Add(1) > 1 {
		o.overlaps.Add(1)
	}
	o.runs.Add(1)
	time.Sleep(time.Millisecond) // a handler that takes time, so that copies could overlap
	n.Add(-1)
	return nil
}

// TestLeaseTwoInstancesNeverOverlap starts two instances with a delivery
// lease and the default completion on one backlog; both replay it at once, so
// every record is delivered up to twice at about the same moment. No two handler
// runs of one record overlap, and each record is handled once.
func TestLeaseTwoInstancesNeverOverlap(t *testing.T) {
	t.Parallel()
	const backlog = 1000
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		// Should a mark still fail, the record's lease runs out and it is
		// handled again, after the first run, as at-least-once promises.
		b, inst, _ := instances(t, backend, 2, 10*time.Second)
		b.backlog(t, backlog)

		handler := &overlapDetector{}
		acked, nacked := replayTogether(t, b, inst, []func(*message.Message) error{handler.handle, handler.handle}, backlog)

		t.Logf("%s: %d records, %d deliveries acked, %d copies nacked while another held the lease, %d handler runs, %d overlapping",
			backend.Name, backlog, acked, nacked, handler.runs.Load(), handler.overlaps.Load())
		for _, e := range b.logger.Entries("error") {
			t.Logf("logged: %s: %v %v", e.Msg, e.Err, e.Fields)
		}
		assert.Zero(t, handler.overlaps.Load(), "no two runs of one record overlap")
		assert.GreaterOrEqual(t, handler.runs.Load(), int64(backlog), "every record handled")
		assert.Zero(t, b.pendingCount(t))
	})
}
