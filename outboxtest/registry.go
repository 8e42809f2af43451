package outboxtest

import (
	"testing"

	"github.com/wmoutbox/outbox"
)

// NewRegistry builds an [outbox.Registry] of the tracked topics that
// tracks inside the test binary, whatever the environment says: it sets
// [outbox.EnvToggle] to "on" for the rest of the test (tb.Setenv) and
// calls [outbox.NewRegistry]. It fails the test on a configuration error.
//
// Because the toggle is an environment variable of the whole process, a
// test that calls NewRegistry cannot be parallel: tb.Setenv panics in a
// test that called t.Parallel, or whose parent did. The variable is
// restored when the test ends.
func NewRegistry(tb testing.TB, tracked ...outbox.Tracked) *outbox.Registry {
	tb.Helper()
	tb.Setenv(outbox.EnvToggle, "on")
	reg, err := outbox.NewRegistry(tracked...)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	return reg
}
