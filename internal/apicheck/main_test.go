package main

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const source = `package p

import "context"

const Max = 3

var Default = T{A: 1}

type T struct {
	A int
	b int
	F func(ctx context.Context, n int) error
}

func (T) M(x int) error    { return nil }
func (*T) P(xs ...string) {}
func (T) hidden()          {}

type I interface {
	Do(ctx context.Context) (int, error)
}

type Alias = T

type List[E any] []E

func New(name string, opts ...int) (*T, error) { return nil, nil }
func unexported()                              {}
`

// TestAPILinesListWhatAUserCanName: exported names, fields and methods,
// with unnamed parameters; nothing unexported.
func TestAPILinesListWhatAUserCanName(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", source, 0)
	require.NoError(t, err)
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check("example.com/p", fset, []*ast.File{f}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{
		"pkg example.com/p, const Max untyped int = 3",
		"pkg example.com/p, func New(string, ...int) (*T, error)",
		"pkg example.com/p, method (*T) P(...string)",
		"pkg example.com/p, method (T) M(int) error",
		"pkg example.com/p, type Alias = T",
		"pkg example.com/p, type I interface",
		"pkg example.com/p, type I interface, Do(context.Context) (int, error)",
		"pkg example.com/p, type List[E any] []E",
		"pkg example.com/p, type T struct",
		"pkg example.com/p, type T struct, A int",
		"pkg example.com/p, type T struct, F func(context.Context, int) error",
		"pkg example.com/p, var Default T",
	}, apiLines(pkg))
}

// TestDiffLinesNamesWhatEachSideLacks: a changed line shows as one removed
// and one added.
func TestDiffLinesNamesWhatEachSideLacks(t *testing.T) {
	removed, added := diffLines("a\nb\nc\n", "a\nc\nd\n")
	assert.Equal(t, []string{"b"}, removed)
	assert.Equal(t, []string{"d"}, added)
	removed, added = diffLines("a\n", "a\n")
	assert.Empty(t, removed)
	assert.Empty(t, added)
}

func TestFileNames(t *testing.T) {
	assert.Equal(t, "outbox.txt", fileName("github.com/wmoutbox/outbox", "github.com/wmoutbox/outbox"))
	assert.Equal(t, "outboxtest_sqlitetest.txt", fileName("github.com/wmoutbox/outbox", "github.com/wmoutbox/outbox/outboxtest/sqlitetest"))
}

// TestOwnPackageLeavesNestedModulesOut: a package under a directory with a
// go.mod of its own is another module's, and its API file is not this
// module's to remove.
func TestOwnPackageLeavesNestedModulesOut(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "otel", "sub"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "store"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "otel", "go.mod"), []byte("module example.com/m/otel\n"), 0o644))
	t.Chdir(dir)
	assert.True(t, ownPackage("example.com/m", "example.com/m"))
	assert.True(t, ownPackage("example.com/m", "example.com/m/store"))
	assert.False(t, ownPackage("example.com/m", "example.com/m/otel"))
	assert.False(t, ownPackage("example.com/m", "example.com/m/otel/sub"))
	assert.False(t, ownPackage("example.com/m", "example.com/other"))
}
