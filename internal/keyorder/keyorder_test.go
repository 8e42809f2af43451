package keyorder

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestACompletionWakesItsWaiters: a copy waiting for a delivery is woken
// by its completion, which reports that someone waited; a wait that
// starts after the completion returns at once.
func TestACompletionWakesItsWaiters(t *testing.T) {
	var w Waiters
	k := Key{Consumer: "ship", ID: 7}
	wake, stop := w.Wait(k)
	defer stop()
	assert.True(t, w.WaitedOn(k))
	select {
	case <-wake:
		t.Fatal("woken before the completion")
	default:
	}
	assert.True(t, w.Done(k), "a copy waited")
	<-wake
	assert.True(t, w.Completed(k))
	late, stopLate := w.Wait(k)
	defer stopLate()
	<-late
	assert.False(t, w.Done(Key{Consumer: "ship", ID: 8}), "nobody waited for 8")
	assert.False(t, w.Completed(Key{Consumer: "stats", ID: 7}), "each consumer's own")
}

// TestAWaiterThatGivesUpLeavesNothing: a wait that stops before the
// completion leaves no waiter behind.
func TestAWaiterThatGivesUpLeavesNothing(t *testing.T) {
	var w Waiters
	k := Key{Consumer: "ship", ID: 1}
	_, stop := w.Wait(k)
	stop()
	assert.False(t, w.WaitedOn(k))
	assert.False(t, w.Done(k))
}

// TestOneRunPerDelivery: a second copy cannot take the place of a
// delivery whose handler runs, until it ends.
func TestOneRunPerDelivery(t *testing.T) {
	var w Waiters
	k := Key{Consumer: "ship", ID: 3}
	assert.True(t, w.ClaimRun(k))
	assert.True(t, w.Runs(k))
	assert.False(t, w.ClaimRun(k))
	w.EndRun(k)
	assert.False(t, w.Runs(k))
	assert.True(t, w.ClaimRun(k))
}

// TestCompletionsAreRememberedUpToALimit: beyond recentDone completions
// the oldest is forgotten.
func TestCompletionsAreRememberedUpToALimit(t *testing.T) {
	var w Waiters
	for i := range recentDone + 1 {
		w.Done(Key{Consumer: "ship", ID: int64(i)})
	}
	assert.False(t, w.Completed(Key{Consumer: "ship", ID: 0}))
	assert.True(t, w.Completed(Key{Consumer: "ship", ID: 1}))
}
