package outbox

import (
	"os"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
)

// EnvToggle is the environment variable that turns tracking on inside a Go
// test binary. It is read only by test binaries, when a registry is built.
const EnvToggle = "WATERMILL_OUTBOX"

// trackingEnabled reports whether registries built now track messages. A
// normal binary always does and never looks at the environment.
func trackingEnabled() bool {
	if !testing.Testing() {
		return true
	}
	return os.Getenv(EnvToggle) == "on"
}

// reportDisabled tells, once per registry, that a test binary without the
// toggle tracks nothing: a program that checks for "0 pending" would
// otherwise pass without any record ever being written.
func (r *Registry) reportDisabled(logger watermill.LoggerAdapter) {
	r.useLogger(logger)
	if r.enabled {
		return
	}
	r.offOnce.Do(func() {
		logger.Info("Outbox tracking is off in this test binary: messages pass through untracked and no record is written. "+
			"Set "+EnvToggle+"=on to track them", watermill.LogFields{"env": EnvToggle})
	})
}
