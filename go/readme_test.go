package distckpt_test

// Every ```go block of the documentation is compiled, and run where it can run (issue 27: "every code snippet in a
// README or doc page is compiled or run by a test"). The convention, shared with the Python and C snippet tests
// (docs/README.md): a block runs unless the line before its fence is `<!-- snippet: compile-only REASON -->`; paths
// under /ckpt/ in a snippet are rewritten to a temporary directory that holds a checkpoint at step-100 (user
// metadata step = "100", a JSON value `step`, an F32 tensor model.w [2, 3]), and paths under /models/ to
// tests/fixtures/safetensors (checkpoints the safetensors package wrote: hub/, single.safetensors).
//
// A block is compiled in a module of its own outside this one, which depends on this package through a replace
// directive, as a user's module would (go/README.md, "Use it from your own module"):
//   - a block that starts with `package` is a file as it is;
//   - a block of imports only is compiled with each import blank (the paths must exist);
//   - a block of declarations (types, funcs, vars) is a file of package main;
//   - anything else is the body of a function; the variables it declares at its top level are marked used, and the
//     imports it names (distckpt, store, fmt, log, ...) are added.

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// docFiles are the pages whose Go blocks are checked, relative to go/.
var docFiles = []string{"../README.md", "README.md", "../docs/*.md", "../docs/*/*.md", "../capi/API.md"}

// snippetTags are the build tags this test was built with, passed on to the snippets' builds (snippet_tags_*_test.go).
var snippetTags []string

type docSnippet struct {
	file        string // relative to the repository
	line        int    // of the opening fence
	lang        string // after the fence: go, python, c
	code        string // indentation of the fence removed
	compileOnly string // the reason, when marked compile-only
}

var (
	fenceOpen  = regexp.MustCompile("^(\\s*)```([A-Za-z0-9_,+-]*)\\s*$")
	fenceClose = regexp.MustCompile("^\\s*```\\s*$")
	marker     = regexp.MustCompile(`^\s*<!--\s*snippet:\s*compile-only\b(.*?)-->\s*$`)
)

// docSnippets extracts every fenced block of language lang from the doc files.
func docSnippets(t *testing.T, lang string) []docSnippet {
	t.Helper()
	var out []docSnippet
	for _, pattern := range docFiles {
		files, err := filepath.Glob(pattern)
		if err != nil || len(files) == 0 {
			t.Fatalf("no doc files match %s (%v)", pattern, err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(string(data), "\n")
			prev := ""
			for i := 0; i < len(lines); i++ {
				m := fenceOpen.FindStringSubmatch(lines[i])
				if m == nil {
					if strings.TrimSpace(lines[i]) != "" {
						prev = lines[i]
					}
					continue
				}
				indent, start := m[1], i
				var body []string
				for i++; i < len(lines) && !fenceClose.MatchString(lines[i]); i++ {
					body = append(body, strings.TrimPrefix(lines[i], indent))
				}
				if i == len(lines) {
					t.Fatalf("%s:%d: a code block that is never closed", file, start+1)
				}
				if m[2] == lang {
					where := filepath.ToSlash(filepath.Join("go", file)) // as the repository names it
					s := docSnippet{file: where, line: start + 1, lang: m[2], code: strings.Join(body, "\n") + "\n"}
					if mm := marker.FindStringSubmatch(prev); mm != nil {
						s.compileOnly = strings.Trim(strings.TrimSpace(mm[1]), "()")
						if s.compileOnly == "" {
							s.compileOnly = "marked compile-only"
						}
					}
					out = append(out, s)
				}
				prev = ""
			}
		}
	}
	return out
}

// knownImports are the packages a function-body snippet may name without importing them.
var knownImports = map[string]string{
	"distckpt": `distckpt "distckpt.dev/go"`, "store": `"distckpt.dev/go/store"`,
	"fmt": `"fmt"`, "log": `"log"`, "os": `"os"`, "json": `"encoding/json"`, "errors": `"errors"`, "fs": `"io/fs"`,
	"strings": `"strings"`, "time": `"time"`, "filepath": `"path/filepath"`,
}

// snippetProgram turns a block into a Go file of package main, and says whether it is something that can run.
func snippetProgram(code, ckptDir string) (string, bool, error) {
	code = strings.ReplaceAll(code, `"/ckpt/`, `"`+filepath.ToSlash(ckptDir)+`/`)
	code = strings.ReplaceAll(code, `"/models/`, `"`+filepath.ToSlash(fixtures.SafetensorsDir())+`/`)
	if strings.HasPrefix(strings.TrimSpace(code), "package ") {
		return code, true, nil
	}
	fset := token.NewFileSet()
	if f, err := parser.ParseFile(fset, "", "package main\n"+code, parser.ParseComments); err == nil {
		importsOnly := true
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); !ok || g.Tok != token.IMPORT {
				importsOnly = false
			}
		}
		if importsOnly {
			var b strings.Builder
			b.WriteString("package main\n\nimport (\n")
			for _, imp := range f.Imports {
				fmt.Fprintf(&b, "\t_ %s\n", imp.Path.Value)
			}
			b.WriteString(")\n\nfunc main() {}\n")
			return b.String(), false, nil
		}
		return "package main\n\n" + imports(f) + code + "\nfunc main() {}\n", false, nil
	}
	// Statements: the body of a function.
	src := "package main\n\nfunc snippet() {\n" + code + "\n}\n"
	f, err := parser.ParseFile(fset, "", src, 0)
	if err != nil {
		return "", false, fmt.Errorf("neither a file, declarations nor statements: %v", err)
	}
	var used []string
	for _, st := range f.Decls[0].(*ast.FuncDecl).Body.List {
		switch s := st.(type) {
		case *ast.AssignStmt:
			if s.Tok == token.DEFINE {
				for _, e := range s.Lhs {
					if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
						used = append(used, id.Name)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, spec := range g.Specs {
					for _, id := range spec.(*ast.ValueSpec).Names {
						if id.Name != "_" {
							used = append(used, id.Name)
						}
					}
				}
			}
		}
	}
	var b strings.Builder
	b.WriteString("package main\n\n" + imports(f) + "func snippet() {\n" + code + "\n")
	for _, name := range used {
		fmt.Fprintf(&b, "\t_ = %s\n", name)
	}
	b.WriteString("}\n\nfunc main() { snippet() }\n")
	return b.String(), true, nil
}

// imports is the import declaration for the known packages that the parsed code names as `name.X` (comments do not
// count).
func imports(f *ast.File) string {
	seen := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && knownImports[id.Name] != "" {
				seen[id.Name] = true
			}
		}
		return true
	})
	var lines []string
	for name := range seen {
		lines = append(lines, "\t"+knownImports[name])
	}
	if len(lines) == 0 {
		return ""
	}
	sort.Strings(lines)
	return "import (\n" + strings.Join(lines, "\n") + "\n)\n\n"
}

// writeDocCheckpoint saves the checkpoint runnable snippets read at <dir>/step-100.
func writeDocCheckpoint(t *testing.T, dir string) {
	t.Helper()
	st := distckpt.NewState()
	if err := st.AddTensorData("model.w", distckpt.F32, []uint64{2, 3}, make([]byte, 24)); err != nil {
		t.Fatal(err)
	}
	if err := st.AddBytes("step", []byte("100")); err != nil {
		t.Fatal(err)
	}
	st.SetUser("step", "100")
	if _, err := distckpt.Save(filepath.Join(dir, "step-100"), st, &distckpt.SaveOptions{NoSync: true}); err != nil {
		t.Fatal(err)
	}
}

func TestDocGoSnippets(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module per snippet")
	}
	snippets := docSnippets(t, "go")
	if len(snippets) < 4 {
		t.Fatalf("found %d Go snippets in %v; the extraction is broken", len(snippets), docFiles)
	}
	goDir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	ckptDir := t.TempDir()
	writeDocCheckpoint(t, ckptDir)
	mod := t.TempDir()
	gomod := "module snippets\n\ngo 1.19\n\nrequire distckpt.dev/go v0.0.0\n\nreplace distckpt.dev/go => " + goDir + "\n"
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	var ran, compiled int
	for _, s := range snippets {
		s := s
		t.Run(fmt.Sprintf("%s:%d", s.file, s.line), func(t *testing.T) {
			src, runnable, err := snippetProgram(s.code, ckptDir)
			if err != nil {
				t.Fatalf("%s:%d: %v\n%s", s.file, s.line, err, s.code)
			}
			dir := filepath.Join(mod, fmt.Sprintf("s%d", s.line))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(dir, "snippet")
			args := []string{"build", "-o", bin}
			if len(snippetTags) > 0 {
				args = append(args, "-tags", strings.Join(snippetTags, ","))
			}
			cmd := exec.Command(goTool, append(args, ".")...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off", "GOPROXY=off")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s:%d does not compile: %v\n%s\ngenerated:\n%s", s.file, s.line, err, out, src)
			}
			compiled++
			if s.compileOnly != "" || !runnable {
				t.Logf("%s:%d compiled, not run (%s)", s.file, s.line, firstNonEmpty(s.compileOnly, "declarations only"))
				return
			}
			var stdout, stderr bytes.Buffer
			run := exec.Command(bin)
			run.Dir = ckptDir
			run.Stdout, run.Stderr = &stdout, &stderr
			if err := run.Run(); err != nil {
				t.Fatalf("%s:%d fails when run: %v\nstdout:\n%s\nstderr:\n%s\ngenerated:\n%s", s.file, s.line, err,
					stdout.String(), stderr.String(), src)
			}
			ran++
			t.Logf("%s:%d ran: %s", s.file, s.line, strings.TrimSpace(stdout.String()))
		})
	}
	t.Logf("Go snippets: %d found, %d compiled, %d run", len(snippets), compiled, ran)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
