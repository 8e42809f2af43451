// Command apicheck keeps the API files of the module's public packages:
// api/<package>.txt lists a package's exported API, one line per name,
// field and method, as Go's own api/ files do. It reads the packages'
// compiled export data, so what it lists is what a user can call.
//
//	go run ./internal/apicheck      # compare: fails, printing the difference, when code and files differ
//	go run ./internal/apicheck -w   # write the files from the code
//
// The public packages are those of the module of the current directory
// but commands, internal packages and examples; from another module of
// the workspace, `go run github.com/wmoutbox/outbox/internal/apicheck -dir
// ../api` keeps its files beside the root module's.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

func main() {
	write := flag.Bool("w", false, "write the API files instead of comparing them")
	dir := flag.String("dir", "api", "the directory of the API files")
	flag.Parse()
	if err := run(*dir, *write, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(1)
	}
}

// errDiffers is run's error when the files do not match the code.
var errDiffers = errors.New("the API files differ from the code: run `go run ./internal/apicheck -w`, commit api/, and list a removed or changed line in CHANGELOG.md as a breaking change")

// listed is one package of `go list -json -export -deps`.
type listed struct {
	ImportPath string
	Name       string
	Export     string
	Module     *struct{ Path string }
	Standard   bool
}

func run(dir string, write bool, out io.Writer) error {
	pkgs, exports, module, err := load()
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok || file == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	want := map[string]string{}
	for _, path := range pkgs {
		pkg, err := imp.Import(path)
		if err != nil {
			return fmt.Errorf("importing %s: %w", path, err)
		}
		want[fileName(module, path)] = strings.Join(apiLines(pkg), "\n") + "\n"
	}
	if write {
		return writeFiles(dir, module, want)
	}
	return compare(dir, module, want, out)
}

// stale are the API files of dir that list a package of module that is
// no longer one of want's. The files of another module (one directory may
// hold those of several) are left alone.
func stale(dir, module string, want map[string]string) []string {
	files, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
	var out []string
	for _, f := range files {
		if _, ok := want[filepath.Base(f)]; ok {
			continue
		}
		text, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		first, _, _ := strings.Cut(string(text), ",")
		if path, ok := strings.CutPrefix(first, "pkg "); ok && ownPackage(module, path) {
			out = append(out, f)
		}
	}
	return out
}

// ownPackage reports whether path is a package of module, the module of
// the current directory, and not of a module nested in its tree (one with
// a go.mod of its own).
func ownPackage(module, path string) bool {
	if path == module {
		return true
	}
	rel, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return false
	}
	dir := "."
	for _, elem := range strings.Split(rel, "/") {
		dir = filepath.Join(dir, elem)
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return false
		}
	}
	return true
}

// load lists the module's public packages and the export data of every
// package they need.
func load() (pkgs []string, exports map[string]string, module string, err error) {
	cmd := exec.Command("go", "list", "-json", "-export", "-deps", "./...")
	cmd.Stderr = os.Stderr
	raw, err := cmd.Output()
	if err != nil {
		return nil, nil, "", fmt.Errorf("go list: %w", err)
	}
	// The module of the current directory's go.mod: in a workspace, go
	// list -m names every module of it.
	modFile, err := os.ReadFile("go.mod")
	if err != nil {
		return nil, nil, "", err
	}
	for _, line := range strings.Split(string(modFile), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			module = strings.Trim(strings.TrimSpace(rest), `"`)
			break
		}
	}
	if module == "" {
		return nil, nil, "", errors.New("go.mod names no module")
	}
	exports = map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(raw))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			return nil, nil, "", fmt.Errorf("go list output: %w", err)
		}
		exports[p.ImportPath] = p.Export
		if p.Module != nil && p.Module.Path == module && public(module, p) {
			pkgs = append(pkgs, p.ImportPath)
		}
	}
	sort.Strings(pkgs)
	return pkgs, exports, module, nil
}

// public reports whether p is one of the module's public packages.
func public(module string, p listed) bool {
	rel := strings.TrimPrefix(p.ImportPath, module)
	return p.Name != "main" && !strings.Contains(rel+"/", "/internal/") && !strings.Contains(rel, "/_examples/") && !strings.HasPrefix(rel, "/cmd/")
}

// fileName is the API file of the package path: the root package's is
// named after the module's last element, the others after their path in
// the module, with "_" for "/".
func fileName(module, path string) string {
	rel := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
	if rel == "" {
		rel = module[strings.LastIndex(module, "/")+1:]
	}
	return strings.ReplaceAll(rel, "/", "_") + ".txt"
}

// apiLines are the lines of pkg's exported API, sorted.
func apiLines(pkg *types.Package) []string {
	q := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Name()
	}
	prefix := "pkg " + pkg.Path() + ", "
	var lines []string
	add := func(s string) { lines = append(lines, prefix+s) }
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.Const:
			add(fmt.Sprintf("const %s %s = %s", name, types.TypeString(o.Type(), q), o.Val().ExactString()))
		case *types.Var:
			add(fmt.Sprintf("var %s %s", name, types.TypeString(o.Type(), q)))
		case *types.Func:
			add("func " + name + signature(o.Type().(*types.Signature), q))
		case *types.TypeName:
			typeLines(o, q, add)
		}
	}
	sort.Strings(lines)
	return slices.Compact(lines)
}

// typeLines adds the lines of one exported type: its kind, its exported
// fields or interface methods, and its exported methods.
func typeLines(o *types.TypeName, q types.Qualifier, add func(string)) {
	name := o.Name()
	if o.IsAlias() {
		add(fmt.Sprintf("type %s = %s", name, types.TypeString(types.Unalias(o.Type()), q)))
		return
	}
	named, _ := o.Type().(*types.Named)
	tparams := ""
	if named != nil && named.TypeParams().Len() > 0 {
		var ps []string
		for i := range named.TypeParams().Len() {
			tp := named.TypeParams().At(i)
			ps = append(ps, tp.Obj().Name()+" "+types.TypeString(tp.Constraint(), q))
		}
		tparams = "[" + strings.Join(ps, ", ") + "]"
	}
	head := "type " + name + tparams
	switch u := o.Type().Underlying().(type) {
	case *types.Struct:
		add(head + " struct")
		for i := range u.NumFields() {
			f := u.Field(i)
			if f.Exported() {
				field := f.Name() + " " + typeString(f.Type(), q)
				if f.Embedded() {
					field = "embedded " + types.TypeString(f.Type(), q)
				}
				add(head + " struct, " + field)
			}
		}
	case *types.Interface:
		add(head + " interface")
		for i := range u.NumExplicitMethods() {
			m := u.ExplicitMethod(i)
			if m.Exported() {
				add(head + " interface, " + m.Name() + signature(m.Type().(*types.Signature), q))
			}
		}
		for i := range u.NumEmbeddeds() {
			add(head + " interface, embedded " + types.TypeString(u.EmbeddedType(i), q))
		}
	default:
		add(head + " " + types.TypeString(u, q))
	}
	if named == nil {
		return
	}
	for i := range named.NumMethods() {
		m := named.Method(i)
		if !m.Exported() {
			continue
		}
		sig := m.Type().(*types.Signature)
		recv := name
		if _, ptr := sig.Recv().Type().(*types.Pointer); ptr {
			recv = "*" + name
		}
		add(fmt.Sprintf("method (%s) %s%s", recv, m.Name(), signature(sig, q)))
	}
}

// typeString is types.TypeString, with a function type's parameters
// unnamed.
func typeString(t types.Type, q types.Qualifier) string {
	if sig, ok := t.(*types.Signature); ok {
		return "func" + signature(sig, q)
	}
	return types.TypeString(t, q)
}

// signature is sig without its parameter names, which are not part of the
// API: "(T1, ...T2) (R1, R2)".
func signature(sig *types.Signature, q types.Qualifier) string {
	tuple := func(t *types.Tuple, variadic bool) []string {
		out := make([]string, t.Len())
		for i := range t.Len() {
			typ := t.At(i).Type()
			if variadic && i == t.Len()-1 {
				out[i] = "..." + types.TypeString(typ.(*types.Slice).Elem(), q)
				continue
			}
			out[i] = types.TypeString(typ, q)
		}
		return out
	}
	var b strings.Builder
	if tp := sig.TypeParams(); tp != nil && tp.Len() > 0 {
		var ps []string
		for i := range tp.Len() {
			ps = append(ps, tp.At(i).Obj().Name()+" "+types.TypeString(tp.At(i).Constraint(), q))
		}
		b.WriteString("[" + strings.Join(ps, ", ") + "]")
	}
	b.WriteString("(" + strings.Join(tuple(sig.Params(), sig.Variadic()), ", ") + ")")
	switch res := tuple(sig.Results(), false); len(res) {
	case 0:
	case 1:
		b.WriteString(" " + res[0])
	default:
		b.WriteString(" (" + strings.Join(res, ", ") + ")")
	}
	return b.String()
}

// writeFiles writes want into dir, and removes the API files of module's
// packages that are gone.
func writeFiles(dir, module string, want map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range stale(dir, module, want) {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	for name, text := range want {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// compare prints, per file, the lines the code adds (+) and those it no
// longer has (-), and returns errDiffers when there are any.
func compare(dir, module string, want map[string]string, out io.Writer) error {
	differs := false
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	for _, f := range stale(dir, module, want) {
		names = append(names, filepath.Base(f))
	}
	sort.Strings(names)
	for _, name := range names {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		removed, added := diffLines(string(got), want[name])
		if len(removed)+len(added) == 0 {
			continue
		}
		differs = true
		fmt.Fprintf(out, "%s:\n", filepath.Join(dir, name))
		for _, l := range removed {
			fmt.Fprintf(out, "- %s\n", l)
		}
		for _, l := range added {
			fmt.Fprintf(out, "+ %s\n", l)
		}
	}
	if differs {
		return errDiffers
	}
	fmt.Fprintf(out, "API files match the code (%d packages)\n", len(want))
	return nil
}

// diffLines returns the lines of a missing from b, and of b missing from a.
func diffLines(a, b string) (onlyA, onlyB []string) {
	set := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			if l != "" {
				m[l] = true
			}
		}
		return m
	}
	as, bs := set(a), set(b)
	for l := range as {
		if !bs[l] {
			onlyA = append(onlyA, l)
		}
	}
	for l := range bs {
		if !as[l] {
			onlyB = append(onlyB, l)
		}
	}
	sort.Strings(onlyA)
	sort.Strings(onlyB)
	return onlyA, onlyB
}
