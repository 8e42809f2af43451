package outbox_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// Topology: four instances of one service start together on one backlog,
// while a fifth, running instance has just published a record.
func TestFourInstancesReplayTogether(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		const backlog, instances = 120, 4
		for _, grace := range []time.Duration{0, time.Hour} {
			b := setup(t, backend, sqlstore.Mark)
			crashBeforeConsumption(t, b, backlog)
			b.backdate(t, "created_at", 0)  // saved long ago, never delivered
			crashBeforeConsumption(t, b, 1) // just sent by a running instance

			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}) // nobody subscribes: counting the sends is enough
			t.Cleanup(func() { _ = gc.Close() })
			sends := &countingPublisher{Publisher: gc}
			start := make(chan struct{})
			errs := make(chan error, instances)
			var wg sync.WaitGroup
			for range instances {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					cfg := outbox.ReplayConfig{PageSize: 10, Mode: outbox.ReplayClaimed, ClaimGrace: grace}
					if grace == 0 {
						cfg = outbox.ReplayConfig{PageSize: 10, Mode: outbox.ReplayAll}
					}
					_, err := outbox.Replay(b.ctx(t), b.reg, sends, cfg, nil)
					errs <- err
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			_, copies := sends.counts()
			t.Logf("%s: %d instances replaying %d pending records sent %d copies with ClaimGrace %v", backend.Name, instances, backlog+1, copies, grace)
			if grace == 0 {
				assert.Equal(t, instances*(backlog+1), copies, "replaying all, every instance sends every pending record")
			} else {
				assert.Equal(t, backlog+1, copies, "by claims each record is sent once, the one just sent too: "+
					"never sent again since its publish, it may be one whose send failed")
			}
			assert.Equal(t, backlog+1, b.pendingCount(t), "replay completes nothing: the records wait for their handlers")
		}
	})
}

var _ message.Publisher = (*countingPublisher)(nil)

// Topology: one instance starting on a backlog whose records are not
// being completed, with a ClaimGrace shorter than its replay takes: the
// first pages are past their grace again before the last is claimed.
func TestReplayWithATinyClaimGraceSendsEachRecordOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		const backlog = 45
		b := setup(t, backend, sqlstore.Mark)
		crashBeforeConsumption(t, b, backlog)
		sends := &countingPublisher{Publisher: &refuseAfter{n: 3 * backlog}} // a replay that goes round and round fails instead of hanging
		res, err := outbox.Replay(b.ctx(t), b.reg, sends, outbox.ReplayConfig{PageSize: 10, ClaimGrace: time.Microsecond}, nil)
		require.NoError(t, err)
		assert.Equal(t, backlog, res.Total())
		_, copies := sends.counts()
		assert.Equal(t, backlog, copies, "each record is claimed and sent once")
	})
}

// refuseAfter discards n messages, then refuses every Publish: a sender
// caught in a loop fails the test instead of running until its timeout.
type refuseAfter struct {
	mu sync.Mutex
	n  int
}

func (r *refuseAfter) Publish(_ string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n -= len(msgs); r.n < 0 {
		return errors.New("more copies than the test allows: the sender is going round in a loop")
	}
	return nil
}

func (r *refuseAfter) Close() error { return nil }
