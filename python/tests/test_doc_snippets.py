"""Every ```python and ```c block of the READMEs and docs/ is compiled, and run where it can run (issue 27).

The convention (docs/README.md, shared with go/readme_test.go):

- A block runs unless the line before its opening fence is ``<!-- snippet: compile-only (why) -->``: blocks that need
  torch, JAX, Lightning, Orbax, several ranks, a GPU, S3 or names from the text around them are compiled only.
- Paths under ``/ckpt/`` are rewritten to a temporary directory holding a checkpoint at ``step-100`` (user metadata
  ``step`` = "100", a value ``step``, an F32 tensor ``model.w`` [2, 3]). A Python block runs with ``distckpt`` and
  ``numpy as np`` imported, in that directory.
- A compile-only Python block still has its ``distckpt`` names checked: every ``from distckpt... import X`` and
  every ``distckpt.a.b`` attribute must exist (a module whose third-party dependency is missing is skipped).
- C blocks are compiled with ``cc -std=c99 -pedantic -Werror -fsyntax-only`` against capi/include: a whole program
  (it has ``main``) or a file of functions as it is, a fragment inside a function body, both after the standard
  headers a snippet usually needs.

```sh``` blocks (of every README, rust/README.md included, and docs/) are not run: they need Bazel, a GPU, a cluster
or a built tree. Each is checked instead (issue 38): ``bash -n`` parses it, and every command it names exists: a path
in the repository (relative to the ``cd`` before it; ``/path/to/distckpt`` is the repository), a program on PATH or one
the pages tell the reader to install, or one an earlier command of the block builds (``-o NAME``, ``bazel build
//pkg:name``, the Go CLI); the subcommands of ``python -m distckpt`` and of the Go ``distckpt`` must exist too. The C
snippet of README.md's "Using it from C" is also built and run as a program by tests/consumers/c/run.sh.

Rust's are doctests (rust/distckpt/src/lib.rs); Go's are go/readme_test.go's.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

import distckpt

REPO = Path(__file__).resolve().parents[2]
if not (REPO / "README.md").is_file() or not (REPO / "docs").is_dir():
    pytest.skip("not run from a checkout: the documentation is not beside the tests", allow_module_level=True)
DOC_FILES = sorted(
    {
        REPO / "README.md",
        REPO / "python" / "README.md",
        REPO / "go" / "README.md",
        REPO / "capi" / "API.md",
        *(REPO / "docs").rglob("*.md"),
    }
)
FENCE_OPEN = re.compile(r"^(\s*)```([A-Za-z0-9_,+-]*)\s*$")
FENCE_CLOSE = re.compile(r"^\s*```\s*$")
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*compile-only\b(.*?)-->\s*$")


class Snippet:
    def __init__(self, path: Path, line: int, lang: str, code: str, compile_only: str | None):
        self.path, self.line, self.lang, self.code, self.compile_only = path, line, lang, code, compile_only

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def extract(paths, lang: str) -> list[Snippet]:
    """The fenced blocks of language `lang`, with the fence's indentation removed."""
    out = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").split("\n")
        prev, i = "", 0
        while i < len(lines):
            m = FENCE_OPEN.match(lines[i])
            if not m:
                if lines[i].strip():
                    prev = lines[i]
                i += 1
                continue
            indent, start, body = m.group(1), i, []
            i += 1
            while i < len(lines) and not FENCE_CLOSE.match(lines[i]):
                body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
                i += 1
            assert i < len(lines), f"{path}:{start + 1}: a code block that is never closed"
            if m.group(2) == lang:
                mm = MARKER.match(prev)
                reason = (mm.group(1).strip().strip("()") or "marked compile-only") if mm else None
                out.append(Snippet(path, start + 1, lang, "\n".join(body) + "\n", reason))
            prev = ""
            i += 1
    return out


PYTHON = extract(DOC_FILES, "python")
C = extract(DOC_FILES, "c")
SH = extract(sorted({*DOC_FILES, REPO / "rust" / "README.md"}), "sh")


def test_the_extraction_finds_the_blocks():
    # A broken fence pattern would otherwise make every test below vanish.
    assert len(PYTHON) >= 15, [s.where for s in PYTHON]
    assert len(C) >= 3, [s.where for s in C]
    assert len(SH) >= 20, [s.where for s in SH]
    assert any(s.compile_only is None for s in PYTHON), "no Python snippet runs"


def test_the_extraction_reads_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- snippet: compile-only (needs torch) -->\n```python\nimport torch\n```\n\n"
        "```python\nx = 1\n```\n  ```c\n  int x;\n  ```\n",
        encoding="utf-8",
    )
    py = extract([page], "python")
    want = [(4, "import torch\n", "needs torch"), (8, "x = 1\n", None)]
    assert [(s.line, s.code, s.compile_only) for s in py] == want
    assert [(s.line, s.code) for s in extract([page], "c")] == [(11, "int x;\n")]


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    """The directory /ckpt/ is rewritten to, with a checkpoint at step-100."""
    root = tmp_path_factory.mktemp("ckpt")
    distckpt.save({"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "step": 100}, str(root / "step-100"))
    return root


def _rewrite(code: str, root: Path) -> str:
    return code.replace('"/ckpt/', f'"{root.as_posix()}/')


def _check_distckpt_names(tree: ast.AST) -> list[str]:
    """The distckpt names a block uses that do not exist; names behind a missing third-party module are skipped."""
    missing = []

    def resolve(dotted: str) -> bool | None:  # None: cannot tell (a dependency is missing)
        parts = dotted.split(".")
        try:
            obj = importlib.import_module(parts[0])
        except ImportError:
            return None
        for i, part in enumerate(parts[1:], start=1):
            if hasattr(obj, part):
                obj = getattr(obj, part)
                continue
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except ModuleNotFoundError as e:
                return False if e.name and e.name.startswith("distckpt") else None
            except ImportError:
                return None
        return True

    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "distckpt":
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            chain, cur = [], node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id == "distckpt":
                names = [".".join(["distckpt", *reversed(chain)])]
        for name in names:
            if resolve(name) is False:
                missing.append(name)
    return missing


@pytest.mark.parametrize("snippet", PYTHON, ids=[s.where for s in PYTHON])
def test_python_snippet(snippet: Snippet, ckpt_dir, monkeypatch):
    code = _rewrite(snippet.code, ckpt_dir)
    try:
        compiled = compile(code, snippet.where, "exec")
    except SyntaxError as e:
        pytest.fail(f"{snippet.where} does not compile: {e}\n{snippet.code}")
    missing = _check_distckpt_names(ast.parse(code))
    assert not missing, f"{snippet.where} uses distckpt names that do not exist: {missing}"
    if snippet.compile_only:
        return  # compiled and its names checked; not run (the reason is in the page)
    monkeypatch.chdir(ckpt_dir)
    exec(compiled, {"__name__": "__snippet__", "distckpt": distckpt, "np": np})


@pytest.mark.parametrize("snippet", C, ids=[s.where for s in C])
def test_c_snippet(snippet: Snippet, tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler")
    headers = "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
    headers += "#include <distckpt/distckpt.h>\n\n"
    code = snippet.code
    top_level_function = re.search(r"^[A-Za-z_][\w \t*]*\([^;{]*\)\s*\{", code, re.M)
    if re.search(r"\bmain\s*\(", code):
        source = code  # a whole program compiles as pasted: its own #includes, nothing added (issue 38)
    elif top_level_function:
        source = headers + code
    else:  # a fragment: statements (and declarations) in a function body
        body = textwrap.indent(code, "  ")
        source = headers + "int snippet(void);\nint snippet(void) {\n" + body + "  return 0;\n}\n"
    src = tmp_path / "snippet.c"
    src.write_text(source, encoding="utf-8")
    cmd = [cc, "-std=c99", "-pedantic", "-Wall", "-Werror", "-fsyntax-only", f"-I{REPO / 'capi' / 'include'}", str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{snippet.where} does not compile:\n{res.stderr}\ncompiled as:\n{source}"


def test_the_readme_example_saves_where_no_directory_exists_yet(tmp_path, monkeypatch):
    """Issue 38: README's first Python example, as a new user runs it on a fresh machine, where "/ckpt" does not exist:
    the save makes the missing parent directories (mkdir -p), as torch.distributed.checkpoint does."""
    (first,) = [s for s in PYTHON if s.path == REPO / "README.md" and "distckpt.save(" in s.code]
    fresh = tmp_path / "not" / "made" / "yet"
    code = first.code.replace('"/ckpt/', f'"{fresh.as_posix()}/')
    assert code != first.code, "the README example no longer saves under /ckpt/"
    monkeypatch.chdir(tmp_path)
    exec(compile(code, first.where, "exec"), {"__name__": "__snippet__"})
    assert (fresh / "step-10" / "metadata.dckpt").is_file()
    # Every new directory was made (and is a plain directory, not a checkpoint).
    assert sorted(p.name for p in (tmp_path / "not").rglob("*") if p.is_dir())[:3] == ["made", "step-10", "yet"]


# Shell snippets (issue 38): what a reader pastes must at least parse and name commands that exist.
SHELL_BUILTINS = {"cd", "export", "set", "source", ".", "echo", "true", "false", "exit", "test", "["}
# Programs the pages tell the reader to install (Debian packages) where this machine may lack them.
INSTALLED_BY_THE_PAGES = {"go": "golang-go", "cargo": "cargo", "bazel": "bazel-bootstrap", "apt-get": "apt",
                          "pkg-config": "pkg-config", "pip": "python3-pip", "cc": "gcc", "cmake": "cmake",
                          "zig": "PyPI's ziglang (scripts/install_zig.sh)"}  # fmt: skip
# Files a command of a page produces elsewhere than in its own block: scripts/gpu_kit.sh DIR installs
# scripts/gpu_check.sh as DIR/gpu_check.sh, which docs/gpu.md unpacks as kit/.
PRODUCED = {"kit/gpu_check.sh": "scripts/gpu_check.sh"}
# Programs the pages show how to build (README.md, docs/cli.md: `cd go && go build -o distckpt ./cmd/distckpt`), by
# their sources.
BUILT_BY_THE_PAGES = {"distckpt": "go/cmd/distckpt/main.go"}


def _shell_words(code: str):
    """(word, following words, cwd, the words of its line) of each simple command of a block, in order: lines joined
    at a trailing '\\', comments dropped, split at ; && || | & and $( ... ); `cd DIR` moves cwd."""
    import shlex

    text = re.sub(r"\\\n", " ", code)
    cwd = REPO
    for line in text.split("\n"):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok in (";", "&&", "||", "|", "&", "(", ")", "$"):
                i += 1
                continue
            if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tok):  # an assignment before the command
                i += 1
                continue
            j = i + 1
            while j < len(tokens) and tokens[j] not in (";", "&&", "||", "|", "&", "(", ")"):
                j += 1
            args = [t for t in tokens[i + 1 : j] if t != "$"]
            yield tok, args, cwd, tokens
            if tok == "cd" and args:
                cwd = cwd / args[0]
            i = j
            if i < len(tokens) and tokens[i] == ")":  # the rest of a word $(...) was part of: not a command
                i += 1
                while i < len(tokens) and tokens[i] not in (";", "&&", "||", "|", "&", "("):
                    i += 1


def _go_cli_commands() -> set:
    names = set()
    for go_file in (REPO / "go" / "cmd" / "distckpt").glob("*.go"):
        text = go_file.read_text(encoding="utf-8")
        names |= set(re.findall(r'^\s*name:\s*"([a-z-]+)"', text, re.M))
        for aliases in re.findall(r"aliases:\s*\[\]string\{([^}]*)\}", text):
            names |= set(re.findall(r'"([a-z-]+)"', aliases))
    return names | {"help", "--help", "--version", "-V", "-q"}


def _python_cli_commands() -> set:
    import argparse

    from distckpt.__main__ import _parser

    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices) | {"--help", "-h", "-q"}


def _bazel_target_exists(label: str) -> bool:
    m = re.match(r"^//([\w/]+):([\w.-]+)$", label)
    if not m:
        return False
    build = REPO / m.group(1) / "BUILD.bazel"
    return build.is_file() and f'name = "{m.group(2)}"' in build.read_text(encoding="utf-8")


@pytest.mark.parametrize("snippet", SH, ids=[s.where for s in SH])
def test_shell_snippet_parses_and_names_commands_that_exist(snippet: Snippet):
    bash = shutil.which("bash")
    assert bash, "no bash"
    res = subprocess.run([bash, "-n"], input=snippet.code, capture_output=True, text=True)
    assert res.returncode == 0, f"{snippet.where}: bash -n: {res.stderr}\n{snippet.code}"
    built: set = set()  # what earlier commands of the block make, as paths from the repository root
    problems = []
    for word, args, cwd, line in _shell_words(snippet.code):
        word = word.replace("/path/to/distckpt", str(REPO))
        here = (cwd / word).resolve() if "/" in word else None
        if word in SHELL_BUILTINS:
            pass
        elif here is not None and (here.exists() or str(here) in built):
            pass
        elif word in PRODUCED and (REPO / PRODUCED[word]).is_file():
            pass
        elif word in BUILT_BY_THE_PAGES and (REPO / BUILT_BY_THE_PAGES[word]).is_file():
            pass
        elif here is None and (shutil.which(word) or word in INSTALLED_BY_THE_PAGES or word == "python"):
            pass
        else:
            problems.append(f"{word!r} (in {cwd.relative_to(REPO) if cwd.is_relative_to(REPO) else cwd})")
        if word != "-o" and "-o" in line[:-1]:  # the line's output (after a $(...) it is not in args)
            built.add(str((cwd / line[line.index("-o") + 1]).resolve()))
        if word == "bazel" and args[:1] == ["build"]:
            for label in args[1:]:
                if label.startswith("//"):
                    if not _bazel_target_exists(label):
                        problems.append(f"bazel target {label}")
                    built.add(str((REPO / "bazel-bin" / label[2:].replace(":", "/")).resolve()))
        # The subcommands of the two CLIs.
        if word == "python" and args[:2] == ["-m", "distckpt"] and len(args) > 2:
            if args[2] not in _python_cli_commands():
                problems.append(f"python -m distckpt {args[2]}")
        if Path(word).name == "distckpt" and args and args[0] not in _go_cli_commands():
            problems.append(f"distckpt {args[0]}")
    assert not problems, f"{snippet.where} names what does not exist: {problems}\n{snippet.code}"


def test_the_shell_check_finds_what_is_wrong():
    wrong = Snippet(REPO / "README.md", 1, "sh", "go/cmd/distckpt: distckpt ls /ckpt; distckpt verify x\n", None)
    with pytest.raises(AssertionError, match="go/cmd/distckpt:"):
        test_shell_snippet_parses_and_names_commands_that_exist(wrong)
    code = "cd go && go build -o distckpt ./cmd/distckpt\n./distckpt lz /x\n"
    wrong = Snippet(REPO / "README.md", 1, "sh", code, None)
    with pytest.raises(AssertionError, match="distckpt lz"):
        test_shell_snippet_parses_and_names_commands_that_exist(wrong)
    code = "python -m distckpt inspekt CKPT\nbazel build //tools/nope:launch\n"
    wrong = Snippet(REPO / "README.md", 1, "sh", code, None)
    with pytest.raises(AssertionError, match="inspekt.*//tools/nope:launch"):
        test_shell_snippet_parses_and_names_commands_that_exist(wrong)
    with pytest.raises(AssertionError, match="bash -n"):
        test_shell_snippet_parses_and_names_commands_that_exist(Snippet(REPO / "README.md", 1, "sh", "if then\n", None))
