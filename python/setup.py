"""Builds the extension module with Bazel and packages it, the way TensorStore's setup.py does.

``pip install ./python`` runs ``bazel build //bindings:_distckpt.so`` in the repository (with the installing
interpreter's headers) and copies the result into the wheel. Environment knobs:

- ``DISTCKPT_BAZEL``: the bazel binary (default: ``bazel`` on PATH).
- ``DISTCKPT_BAZEL_OUTPUT_BASE``: a Bazel ``--output_base`` (e.g. to keep apart from another workspace's builds).
- ``DISTCKPT_BAZEL_FLAGS``: extra build flags, e.g. ``-c opt`` or ``--config=cuda``.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import setuptools
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HEADER = ROOT / "capi" / "include" / "distckpt" / "distckpt.h"


def _version() -> str:
    m = re.search(r'#define DCKPT_VERSION_STRING "([^"]+)"', HEADER.read_text())
    if not m:
        raise RuntimeError(f"cannot find DCKPT_VERSION_STRING in {HEADER}")
    return m.group(1)


class BazelExtension(setuptools.Extension):
    """An extension module that Bazel builds: `target` is a cc_binary(linkshared = 1) label."""

    def __init__(self, name: str, target: str) -> None:
        super().__init__(name, sources=[])
        self.target = target


class BazelBuildExt(build_ext):
    def run(self) -> None:
        for ext in self.extensions:
            self._build(ext)

    def _build(self, ext: BazelExtension) -> None:
        if not (ROOT / "WORKSPACE").is_file():
            raise RuntimeError(f"distckpt's extension is built from a source checkout; {ROOT}/WORKSPACE is missing")
        bazel = os.environ.get("DISTCKPT_BAZEL") or shutil.which("bazel")
        if not bazel:
            raise RuntimeError("bazel not found: run scripts/install_deps.sh (Debian's bazel-bootstrap) or set DISTCKPT_BAZEL")
        startup = []
        if os.environ.get("DISTCKPT_BAZEL_OUTPUT_BASE"):
            startup.append("--output_base=" + os.environ["DISTCKPT_BAZEL_OUTPUT_BASE"])
        # The installing interpreter's headers (python_configure reads PYTHON_BIN_PATH); no bazel-* symlinks in the
        # source tree, so that a pip build never repoints the developer's own.
        flags = [f"--repo_env=PYTHON_BIN_PATH={sys.executable}", "--symlink_prefix=/"]
        flags += shlex.split(os.environ.get("DISTCKPT_BAZEL_FLAGS", ""))
        subprocess.check_call([bazel, *startup, "build", *flags, ext.target], cwd=ROOT)
        bin_dir = subprocess.check_output([bazel, *startup, "info", *flags, "bazel-bin"], cwd=ROOT, text=True).strip()
        package, _, name = ext.target.lstrip("/").partition(":")
        built = Path(bin_dir) / package / name
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, dest)  # Bazel's outputs are read-only; the copy is not
        dest.chmod(0o755)


setuptools.setup(
    version=_version(),
    ext_modules=[BazelExtension("distckpt._distckpt", "//bindings:_distckpt.so")],
    cmdclass={"build_ext": BazelBuildExt},
)
