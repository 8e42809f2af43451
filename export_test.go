package outbox

import "time"

// SetInsertTimeout sets the bound of a tracked publish's insert until the
// returned function restores it. Tests that call it must not run in
// parallel with other publishing tests.
func SetInsertTimeout(d time.Duration) (restore func()) {
	old := insertTimeout
	insertTimeout = d
	return func() { insertTimeout = old }
}
