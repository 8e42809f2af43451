package outboxtest

import (
	"testing"

	"github.com/wmoutbox/outbox"
)

// NewRegistry builds an [outbox.Registry] of the tracked topics that
// tracks inside the test binary, whatever the environment says
// ([outbox.NewTrackingRegistry]). It fails the test on a configuration
// error. It changes no environment variable, so tests that call it may
// run in parallel.
func NewRegistry(tb testing.TB, tracked ...outbox.Tracked) *outbox.Registry {
	tb.Helper()
	reg, err := outbox.NewTrackingRegistry(tracked...)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	return reg
}
