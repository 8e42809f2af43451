package outbox

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Backoff spaces the attempts of a failing delivery: after the nth failed
// attempt it is due again after Initial × Multiplier^(n-1), capped at Max,
// give or take Jitter, by the database clock, so it survives restarts.
type Backoff struct {
	// Initial is the delay after the first failure. Defaults to 500
	// milliseconds.
	Initial time.Duration
	// Max caps the delay. Defaults to 1 minute.
	Max time.Duration
	// Multiplier grows the delay after each further failure. Defaults to 2.
	Multiplier float64
	// Jitter varies each delay at random by up to this fraction of it.
	// Defaults to 0.2.
	Jitter float64
	// Disabled makes a failed delivery due again at once. Defaults to
	// false.
	Disabled bool
}

func (b *Backoff) setDefaults() {
	if b.Initial == 0 {
		b.Initial = 500 * time.Millisecond
	}
	if b.Max == 0 {
		b.Max = time.Minute
	}
	if b.Multiplier == 0 {
		b.Multiplier = 2
	}
	if b.Jitter == 0 {
		b.Jitter = 0.2
	}
}

// Validate reports a configuration error, if any.
func (b Backoff) Validate() error {
	switch {
	case b.Initial < 0 || b.Max < 0:
		return fmt.Errorf("%w: Backoff Initial %v and Max %v must not be negative", ErrInvalidConfig, b.Initial, b.Max)
	case b.Max < b.Initial:
		return fmt.Errorf("%w: Backoff Max %v is below Initial %v", ErrInvalidConfig, b.Max, b.Initial)
	case b.Multiplier < 1:
		return fmt.Errorf("%w: Backoff Multiplier %v is below 1", ErrInvalidConfig, b.Multiplier)
	case b.Jitter < 0 || b.Jitter >= 1:
		return fmt.Errorf("%w: Backoff Jitter %v is outside [0, 1)", ErrInvalidConfig, b.Jitter)
	}
	return nil
}

// Delay is how long a delivery waits after its nth failed attempt (n ≥ 1).
func (b Backoff) Delay(attempts int) time.Duration {
	if b.Disabled || attempts < 1 {
		return 0
	}
	d := float64(b.Initial) * math.Pow(b.Multiplier, float64(attempts-1))
	d = math.Min(d, float64(b.Max))
	if b.Jitter > 0 {
		d *= 1 + b.Jitter*(2*rand.Float64()-1)
	}
	return time.Duration(d)
}
