package outbox

import (
	"os"
	"testing"
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
