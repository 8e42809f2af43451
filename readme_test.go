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

// TestReadmeTwoServicesAreTheCompiledExample keeps the README's adoption
// of two services the functions Example_twoServices compiles and runs.
func TestReadmeTwoServicesAreTheCompiledExample(t *testing.T) {
	t.Parallel()
	source, err := os.ReadFile("example_two_services_test.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	want := between(t, string(source), "// README:begin two-services\n", "// README:end two-services\n")
	got := between(t, string(readme), "<!-- two-services:begin -->\n```go\n", "```\n<!-- two-services:end -->")
	require.Equal(t, strings.TrimSpace(want), strings.TrimSpace(got),
		"README.md's two-service adoption must be the functions of example_two_services_test.go")
}

// TestReadmeTestCommandIsCIs keeps the README's "Run the tests" command the
// one .ci/run runs.
func TestReadmeTestCommandIsCIs(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	ci, err := os.ReadFile(".ci/run")
	require.NoError(t, err)
	command := strings.TrimSpace(between(t, string(readme), "Run the tests", "```\n\n"))
	command = command[strings.LastIndex(command, "```sh\n")+len("```sh\n"):]
	require.True(t, strings.HasPrefix(command, "go test "), "README test command %q", command)
	var ciTests []string
	for _, line := range strings.Split(string(ci), "\n") {
		if strings.HasPrefix(line, "go test ") {
			ciTests = append(ciTests, line)
		}
	}
	require.Contains(t, ciTests, command, ".ci/run must run the README's test command")
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
