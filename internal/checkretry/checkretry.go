// Package checkretry spaces the checks of a middleware while they fail, so
// that a database that refuses connections (a check fails in microseconds)
// does not make a broker that redelivers at once spin on it.
package checkretry

import (
	"sync/atomic"
	"time"
)

// Spacer counts a middleware's consecutive failed checks, shared by every
// delivery: the message of the nth holds for a delay that doubles with n,
// from Delay up to Max.
type Spacer struct {
	Delay, Max time.Duration
	streak     atomic.Int64
}

// Failed counts one more failed check and returns how long to hold its
// message before the nack: the delay that the count has reached.
func (s *Spacer) Failed() time.Duration {
	n := s.streak.Add(1)
	d := s.Delay
	for i := int64(1); i < n && d < s.Max; i++ {
		d *= 2
	}
	return min(d, s.Max)
}

// Answered resets the count: the database answered a check.
func (s *Spacer) Answered() {
	if s.streak.Load() != 0 {
		s.streak.Store(0)
	}
}
