package outbox_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocsLinksResolve keeps every relative link of the README, docs/ and
// the examples' READMEs pointing at a file that exists and, with a
// #fragment into a markdown file, at one of its headings, named as GitHub
// names them.
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	files := []string{"README.md"}
	for _, pattern := range []string{"docs/*.md", "_examples/*/README.md"} {
		matches, err := filepath.Glob(pattern)
		require.NoError(t, err)
		files = append(files, matches...)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		anchors[file] = headingAnchors(string(text))
		return anchors[file]
	}

	links := 0
	for _, file := range files {
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, link := range markdownLinks(string(text)) {
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			links++
			path, fragment, _ := strings.Cut(link, "#")
			target := file
			if path != "" {
				target = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				if _, err := os.Stat(target); err != nil {
					assert.Failf(t, "broken link", "%s links to %s: no such file", file, link)
					continue
				}
			}
			if fragment == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			assert.Truef(t, anchorsOf(target)[fragment], "%s links to %s: %s has no heading with anchor #%s", file, link, target, fragment)
		}
	}
	require.Greater(t, links, 10, "the docs' relative links were not found")
}

func TestHeadingAnchorsFollowGitHub(t *testing.T) {
	t.Parallel()
	got := headingAnchors("# Benchmarks\n## The completion's commit\n```sh\n# not a heading\n```\n### PostgreSQL: router, `publish`\n## Runs\n## Runs\n")
	for _, want := range []string{"benchmarks", "the-completions-commit", "postgresql-router-publish", "runs", "runs-1"} {
		assert.True(t, got[want], "anchor %q in %v", want, got)
	}
	assert.False(t, got["not-a-heading"])
}

var (
	linkRE       = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLinkRE    = regexp.MustCompile(`(?m)^\s*\[[^\]]+\]:\s*(\S+)`)
	inlineCodeRE = regexp.MustCompile("`[^`\n]*`")
	htmlAnchorRE = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// markdownLinks returns the targets of the inline and reference links of a
// markdown text, outside code.
func markdownLinks(text string) []string {
	var links []string
	for _, line := range proseLines(text) {
		line = inlineCodeRE.ReplaceAllString(line, "")
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			links = append(links, m[1])
		}
		for _, m := range refLinkRE.FindAllStringSubmatch(line, -1) {
			links = append(links, m[1])
		}
	}
	return links
}

// headingAnchors returns the anchors GitHub gives a markdown text's
// headings: lower case, spaces to '-', punctuation dropped, and a -1, -2 …
// suffix on repeats; plus explicit <a name> and <a id> anchors.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(text) {
		for _, m := range htmlAnchorRE.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		heading := strings.TrimLeft(line, "#")
		if heading == line || !strings.HasPrefix(heading, " ") || len(line)-len(heading) > 6 {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchor := b.String()
		if n := seen[anchor]; n > 0 {
			anchors[anchor+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[anchor] = true
		}
		seen[anchor]++
	}
	return anchors
}

// proseLines returns the lines of a markdown text outside fenced code blocks.
func proseLines(text string) []string {
	var lines []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			lines = append(lines, line)
		}
	}
	return lines
}

// TestDocsNameTestsThatExist keeps every test, benchmark or fuzz target the
// docs cite as proof (`TestName/sub` in backquotes) defined somewhere in
// the repository, so that a renamed or removed test cannot leave a
// guarantee proved by nothing.
func TestDocsNameTestsThatExist(t *testing.T) {
	t.Parallel()
	defined := map[string]bool{}
	funcs := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)\w*)\(`)
	require.NoError(t, filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcs.FindAllStringSubmatch(string(text), -1) {
			defined[m[1]] = true
		}
		return nil
	}))
	cited := regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Z]\\w*)")
	files, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	n := 0
	for _, file := range append(files, "README.md") {
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range cited.FindAllStringSubmatch(string(text), -1) {
			n++
			assert.Truef(t, defined[m[1]], "%s cites %s, which no _test.go file defines", file, m[1])
		}
	}
	require.Greater(t, n, 50, "the docs' cited tests were not found")
}
