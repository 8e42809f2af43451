package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestCleanerPausesBetweenBatches: after a full batch, a cleanup waits
// CleanerConfig.Pause before it deletes the next; a context that ends
// during the pause ends the cleanup with the first batch deleted and no
// other.
func TestCleanerPausesBetweenBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Backends()[1], sqlstore.Mark)
	msgs := b.publishTracked(t, 5)
	mw := b.middleware(t)((&recordingHandler{}).handle)
	for _, m := range msgs {
		_, err := mw(m)
		require.NoError(t, err)
	}
	b.backdate(t, "processed_at", 0)
	c, err := outboxops.NewCleaner(b.reg, outboxops.CleanerConfig{OlderThan: time.Hour, BatchSize: 2, Pause: time.Hour}, b.logger)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx(t))
	defer cancel()
	type outcome struct {
		n   int
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		n, err := c.CleanOnce(ctx)
		done <- outcome{n, err}
	}()
	// The first batch is gone once three records are left; the cleanup
	// is then in its pause of an hour.
	require.Eventually(t, func() bool { return b.rowCount(t) == 3 }, time.Minute, 5*time.Millisecond)
	cancel()
	got := <-done
	require.ErrorIs(t, got.err, context.Canceled)
	assert.Equal(t, 2, got.n, "one batch deleted before the pause")
	assert.Equal(t, 3, b.rowCount(t), "no batch deleted after the context ended")
}
