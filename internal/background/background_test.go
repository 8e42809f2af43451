package background

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const guard = 20 * time.Second

// TestCompletionsGoInBatches: the completions that start within the
// first one's wait share its batch, which goes once the wait is over; a
// completion started with no wait goes at once.
func TestCompletionsGoInBatches(t *testing.T) {
	var w Work
	first, ok := w.StartCompletion(time.Hour)
	require.True(t, ok)
	second, ok := w.StartCompletion(time.Hour)
	require.True(t, ok)
	assert.Equal(t, first, second, "one batch")
	select {
	case <-first:
		t.Fatal("the batch went before its wait")
	default:
	}
	now, ok := w.StartCompletion(0)
	require.True(t, ok)
	select {
	case <-now:
	default:
		t.Fatal("a completion without a wait waits for no batch")
	}
	for range 3 {
		w.DoneCompletion()
	}
	require.NoError(t, w.WaitCompletions(context.Background()))
}

// TestAFullBatchGoesBeforeItsWait: the completion that fills a batch sends
// it at once; the next one starts a batch of its own, and the first
// batch's timer, which runs sendLocked once its wait is over, leaves that
// one gathering.
func TestAFullBatchGoesBeforeItsWait(t *testing.T) {
	var w Work
	wait := 50 * time.Millisecond
	first, ok := w.StartCompletion(wait)
	require.True(t, ok)
	for range maxBatch - 2 {
		c, ok := w.StartCompletion(wait)
		require.True(t, ok)
		require.Equal(t, first, c, "one batch")
	}
	select {
	case <-first:
		t.Fatal("the batch went one short of full")
	default:
	}
	last, ok := w.StartCompletion(wait)
	require.True(t, ok)
	assert.Equal(t, first, last, "the completion that fills the batch joins it")
	select {
	case <-first:
	default:
		t.Fatal("a full batch did not go at once")
	}
	next, ok := w.StartCompletion(time.Hour)
	require.True(t, ok)
	assert.NotEqual(t, first, next, "a new batch after a full one")
	// The full batch's timer, firing after its wait, must not send the
	// new batch: a completion that joins now still shares it.
	w.mu.Lock()
	w.sendLocked(first)
	w.mu.Unlock()
	joined, ok := w.StartCompletion(time.Hour)
	require.True(t, ok)
	assert.Equal(t, next, joined, "the full batch's timer sent the next batch")
	select {
	case <-next:
		t.Fatal("the next batch went before its wait")
	default:
	}
	for range maxBatch + 2 {
		w.DoneCompletion()
	}
	require.NoError(t, w.WaitCompletions(context.Background()))
}

// TestCompletionsAreBounded: beyond maxBackground completions, and while
// draining, a completion is refused and goes on its handler's path.
func TestCompletionsAreBounded(t *testing.T) {
	var w Work
	for range maxBackground {
		_, ok := w.StartCompletion(0)
		require.True(t, ok)
	}
	_, ok := w.StartCompletion(0)
	assert.False(t, ok, "one more than the bound")
	for range maxBackground {
		w.DoneCompletion()
	}
	w.Draining.Store(true)
	_, ok = w.StartCompletion(0)
	assert.False(t, ok, "while draining")
}

// TestWaitCompletionsWaitsForTheLastOne: WaitCompletions returns once the
// last completion is done, or with its context's error.
func TestWaitCompletionsWaitsForTheLastOne(t *testing.T) {
	var w Work
	_, ok := w.StartCompletion(0)
	require.True(t, ok)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, w.WaitCompletions(ctx), context.Canceled)
	done := make(chan error, 1)
	go func() { done <- w.WaitCompletions(context.Background()) }()
	w.DoneCompletion()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(guard):
		t.Fatal("WaitCompletions did not return once the last completion was done")
	}
}

// TestBusyCoversGoroutinesAndStoppingLoops: Busy is nil with nothing
// running but a loop whose router runs; it is the goroutines' idle channel
// while one runs, and a stopping loop's end while it ends.
func TestBusyCoversGoroutinesAndStoppingLoops(t *testing.T) {
	var w Work
	stopping := false
	end := w.StartLoop(func() bool { return stopping })
	assert.Nil(t, w.Busy(), "a loop of a running router")
	release := make(chan struct{})
	w.Spawn(func() { <-release })
	busy := w.Busy()
	require.NotNil(t, busy)
	close(release)
	select {
	case <-busy:
	case <-time.After(guard):
		t.Fatal("the spawned goroutine's end did not close Busy's channel")
	}
	stopping = true
	ended := w.Busy()
	require.NotNil(t, ended, "a loop of a closing router")
	end()
	<-ended
	assert.Nil(t, w.Busy())
}
