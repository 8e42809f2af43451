package outbox

import (
	"context"
	"time"
)

// SetInsertTimeout sets the bound of a tracked publish's insert until the
// returned function restores it. Tests that call it must not run in
// parallel with other publishing tests.
func SetInsertTimeout(d time.Duration) (restore func()) {
	old := insertTimeout
	insertTimeout = d
	return func() { insertTimeout = old }
}

// SetInsertGrace sets how long a publish whose context ended waits for its
// insert's answer, until the returned function restores it. Tests that
// call it must not run in parallel with other publishing tests.
func SetInsertGrace(d time.Duration) (restore func()) {
	old := insertGrace
	insertGrace = d
	return func() { insertGrace = old }
}

// SetResubmitDefaults sets the default OlderThan and Interval of the stale
// resubmitter (and so the replay's default ClaimGrace) until the returned
// function restores them, so that a test of the README's adoption, which
// sets neither, runs in milliseconds. Tests that call it must not run in
// parallel with tests that rely on the defaults.
func SetResubmitDefaults(olderThan, interval time.Duration) (restore func()) {
	oldAge, oldInterval := defaultResubmitOlderThan, defaultResubmitInterval
	defaultResubmitOlderThan, defaultResubmitInterval = olderThan, interval
	return func() { defaultResubmitOlderThan, defaultResubmitInterval = oldAge, oldInterval }
}

// WaitBackgroundCompletions waits for the completions running in the
// background only, not for the rest of the registry's background work (a
// producing handler's completion waits for an ack that a test calling the
// middleware directly never gives).
func WaitBackgroundCompletions(ctx context.Context, r *Registry) error {
	return r.background.WaitCompletions(ctx)
}
