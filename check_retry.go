package outbox

// Check retry: spacing the checks of a middleware while they fail, so that
// a database that refuses connections (a check fails in microseconds) does
// not make a broker that redelivers at once spin on it.

import (
	"sync/atomic"
	"time"
)

// failedChecks counts a middleware's consecutive failed checks, shared by
// every delivery: the message of the nth holds for a delay that doubles
// with n, from [MiddlewareConfig.CheckRetryDelay] up to
// [MiddlewareConfig.CheckRetryMaxDelay].
type failedChecks struct {
	delay, max time.Duration
	streak     atomic.Int64
}

// failed counts one more failed check and returns how long to hold its
// message before the nack: the delay that the count has reached.
func (f *failedChecks) failed() time.Duration {
	n := f.streak.Add(1)
	d := f.delay
	for i := int64(1); i < n && d < f.max; i++ {
		d *= 2
	}
	return min(d, f.max)
}

// answered resets the count: the database answered a check.
func (f *failedChecks) answered() {
	if f.streak.Load() != 0 {
		f.streak.Store(0)
	}
}
