package checkretry

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestDelaysDoubleUpToTheMaximumAndResetOnAnAnswer(t *testing.T) {
	s := &Spacer{Delay: 50 * time.Millisecond, Max: 300 * time.Millisecond}
	var got []time.Duration
	for range 5 {
		got = append(got, s.Failed())
	}
	assert.Equal(t, []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}, got)
	s.Answered()
	assert.Equal(t, 50*time.Millisecond, s.Failed(), "an answer starts the spacing over")
}

func TestConcurrentFailuresShareOneCount(t *testing.T) {
	s := &Spacer{Delay: time.Millisecond, Max: time.Hour}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { s.Failed() })
	}
	wg.Wait()
	assert.Equal(t, 1024*time.Millisecond, s.Failed(), "the eleventh failure of the middleware, whichever message it was for")
}

func TestAMaximumBelowTheDelayBoundsTheFirstFailure(t *testing.T) {
	s := &Spacer{Delay: time.Second, Max: 10 * time.Millisecond}
	assert.Equal(t, 10*time.Millisecond, s.Failed())
}
