package outbox_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeAdoptionIsTheCompiledExample keeps the README's adoption code
// the same as the function Example_adoption compiles and runs.
func TestReadmeAdoptionIsTheCompiledExample(t *testing.T) {
	t.Parallel()
	source, err := os.ReadFile("example_adoption_test.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	want := between(t, string(source), "// README:begin adoption\n", "// README:end adoption\n")
	got := between(t, string(readme), "<!-- adoption:begin -->\n```go\n", "```\n<!-- adoption:end -->")
	require.Equal(t, strings.TrimSpace(want), strings.TrimSpace(got),
		"README.md's adoption code must be the adoptOutbox function of example_adoption_test.go")
}

func between(t *testing.T, s, begin, end string) string {
	t.Helper()
	i := strings.Index(s, begin)
	require.GreaterOrEqual(t, i, 0, "missing %q", begin)
	rest := s[i+len(begin):]
	j := strings.Index(rest, end)
	require.GreaterOrEqual(t, j, 0, "missing %q", end)
	return rest[:j]
}
