package testenv

import "testing"

// ForEachBackend runs fn as a parallel subtest, named after the backend, on
// every database.
func ForEachBackend(t *testing.T, fn func(t *testing.T, b Backend)) {
	for _, b := range Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}
