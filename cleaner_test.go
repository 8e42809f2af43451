package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/sqlstore"
)

func TestCleaner(t *testing.T) {
	t.Parallel()

	t.Run("DeletesOldCompletedRecordsInBatches", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			msgs := b.publishTracked(t, 6)
			mw := b.middleware(t)((&recordingHandler{}).handle)
			for _, m := range msgs[:5] {
				_, err := mw(m)
				require.NoError(t, err)
			}
			c, err := outboxops.NewCleaner(b.reg, outboxops.CleanerConfig{OlderThan: time.Hour, BatchSize: 2}, b.logger)
			require.NoError(t, err)
			n, err := c.CleanOnce(b.ctx(t))
			require.NoError(t, err)
			assert.Zero(t, n, "records completed within OlderThan are kept")

			b.backdate(t, "processed_at", 0)
			n, err = c.CleanOnce(b.ctx(t))
			require.NoError(t, err)
			assert.Equal(t, 5, n, "batches of two until none is left")
			assert.Equal(t, 1, b.rowCount(t), "the pending record stays")
			assert.Equal(t, 1, b.pendingCount(t))
		})
	})

	t.Run("RunReturnsWhenItsContextEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Backends()[0], sqlstore.Mark)
		c, err := outboxops.NewCleaner(b.reg, outboxops.CleanerConfig{Interval: time.Millisecond}, nil)
		require.NoError(t, err)
		assertRunStops(t, b, c.Run)
	})

	t.Run("ConfigurationIsChecked", func(t *testing.T) {
		t.Parallel()
		reg, err := outbox.NewRegistry()
		require.NoError(t, err)
		_, err = outboxops.NewCleaner(reg, outboxops.CleanerConfig{OlderThan: -time.Second}, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
		_, err = outboxops.NewCleaner(nil, outboxops.CleanerConfig{}, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
	})
}
