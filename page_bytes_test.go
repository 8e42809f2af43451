package outbox_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// pageMeter is a publisher that discards what it is sent and keeps the
// most payload bytes one Publish call carried: replay and the stale
// resubmitter send each page they read with one call, so this is the most
// one page held.
type pageMeter struct {
	mu       sync.Mutex
	maxBytes int
	messages int
}

func (m *pageMeter) Publish(_ string, msgs ...*message.Message) error {
	n := 0
	for _, msg := range msgs {
		n += len(msg.Payload)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maxBytes = max(m.maxBytes, n)
	m.messages += len(msgs)
	return nil
}

func (m *pageMeter) Close() error { return nil }

// TestPagesAreBoundedInBytes replays, and resubmits, a backlog of 20
// records of 4 MiB (80 MiB) with the default byte budget of a page (16 MiB):
// no page holds more than the budget plus one record, and every record is
// sent once. Topology: one table, one publisher, every database.
func TestPagesAreBoundedInBytes(t *testing.T) {
	const records, size = 20, 4 << 20
	bound := outbox.DefaultMaxPageBytes + size
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		payload := bytes.Repeat([]byte("x"), size)
		for range records {
			require.NoError(t, b.store.Insert(b.ctx(t), []recordstore.Record{{Topic: b.topic, UUID: "u", Payload: payload}}))
		}

		t.Run("Replay", func(t *testing.T) {
			meter := &pageMeter{}
			res, err := outbox.Replay(b.ctx(t), b.reg, meter, outbox.ReplayConfig{}, nil)
			require.NoError(t, err)
			assert.Equal(t, records, res.Total())
			assert.Equal(t, records, meter.messages)
			assert.LessOrEqual(t, meter.maxBytes, bound, "one page held %d MiB", meter.maxBytes>>20)
		})

		t.Run("StaleResubmitter", func(t *testing.T) {
			b.backdate(t, "last_sent_at", 0)
			meter := &pageMeter{}
			rs, err := outbox.NewStaleResubmitter(b.reg, meter, outbox.StaleResubmitterConfig{OlderThan: time.Hour}, nil)
			require.NoError(t, err)
			res, err := rs.ResubmitOnce(b.ctx(t))
			require.NoError(t, err)
			assert.Equal(t, records, res.Total())
			assert.LessOrEqual(t, meter.maxBytes, bound, "one claim held %d MiB", meter.maxBytes>>20)
		})
	})
}

// TestPageByteBudgetIsValidated refuses a negative budget.
func TestPageByteBudgetIsValidated(t *testing.T) {
	assert.ErrorIs(t, outbox.ReplayConfig{PageSize: 1, MaxPageBytes: -1}.Validate(), outbox.ErrInvalidConfig)
	assert.ErrorIs(t, outbox.StaleResubmitterConfig{BatchSize: 1, MaxBatchBytes: -1}.Validate(), outbox.ErrInvalidConfig)
}
