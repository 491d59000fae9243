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

```sh``` blocks are not checked: they need Bazel, a GPU, a cluster or a built tree. Rust's are doctests
(rust/distckpt/src/lib.rs); Go's are go/readme_test.go's.
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


def test_the_extraction_finds_the_blocks():
    # A broken fence pattern would otherwise make every test below vanish.
    assert len(PYTHON) >= 15, [s.where for s in PYTHON]
    assert len(C) >= 3, [s.where for s in C]
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
    if re.search(r"\bmain\s*\(", code) or top_level_function:
        source = headers + code
    else:  # a fragment: statements (and declarations) in a function body
        body = textwrap.indent(code, "  ")
        source = headers + "int snippet(void);\nint snippet(void) {\n" + body + "  return 0;\n}\n"
    src = tmp_path / "snippet.c"
    src.write_text(source, encoding="utf-8")
    cmd = [cc, "-std=c99", "-pedantic", "-Wall", "-Werror", "-fsyntax-only", f"-I{REPO / 'capi' / 'include'}", str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{snippet.where} does not compile:\n{res.stderr}\ncompiled as:\n{source}"
