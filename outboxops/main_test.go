package outboxops_test

import (
	"os"
	"testing"

	"github.com/wmoutbox/outbox"
)

// TestMain turns tracking on: inside a test binary the outbox tracks
// nothing unless outbox.EnvToggle says so.
func TestMain(m *testing.M) {
	os.Setenv(outbox.EnvToggle, "on") //nolint:errcheck,gosec // cannot fail for a valid name
	os.Exit(m.Run())
}
