"""Builds the extension module and packages it. Two ways, chosen by the environment:

1. **From a source checkout, with Bazel** (the default; TensorStore's setup.py is the model): ``pip install ./python``
   runs ``bazel build //bindings:_distckpt.so //capi:libdistckpt_gloo.so`` in the repository with the installing
   interpreter's headers and copies both into the package: the extension, which has the core linked in, and beside it
   the Gloo plugin, which the core loads from there on the first Gloo communicator. Knobs:

   - ``DISTCKPT_BAZEL``: the bazel binary (default: ``bazel`` on PATH).
   - ``DISTCKPT_BAZEL_OUTPUT_BASE``: a Bazel ``--output_base`` (e.g. to keep apart from another workspace's builds).
   - ``DISTCKPT_BAZEL_FLAGS``: extra build flags, e.g. ``-c opt`` or ``--config=cuda``.

2. **Against an installed core, without Bazel** (pygit2 against a system libgit2 is the model), for Pythons and
   platforms that have no wheel: ``DISTCKPT_PREBUILT=<install tree> pip install ./python``, where the tree is what
   ``scripts/build_lib.sh`` lays out (``include/distckpt/distckpt.h``, ``lib/libdistckpt.so``, the Gloo plugin
   ``lib/libdistckpt_gloo.so`` and its ``lib/distckpt.libs/``).
   Only the pybind11 extension (the ``bindings/*.cc`` files, which call nothing but the C ABI) is compiled, with
   the C++ compiler setuptools finds and the pybind11 headers of the ``pybind11`` package (``pip install pybind11``)
   or of the system (Debian's ``pybind11-dev``). The library, the Gloo plugin beside it and the plugin's vendored
   dependencies (``distckpt.libs/``) are copied into the package, and the extension finds the library through
   ``$ORIGIN`` (and the library the plugin beside itself): the installed package does not depend on the tree.
   ``DISTCKPT_PREBUILT=pkg-config`` takes the flags from ``pkg-config distckpt`` instead and links the library where
   it is installed (nothing is copied; the library finds the plugin installed beside it).
   ``DISTCKPT_LINK=static`` links the tree's ``lib/libdistckpt.a`` (the core with libc++ inside, only ``dckpt_*``
   global) into the extension instead: the module then needs the C library alone, and only the plugin and its
   ``distckpt.libs/`` are copied beside it. ``scripts/build_wheel.sh`` builds the wheels this way.

3. **From the sdist** (``scripts/build_wheel.sh --sdist``), which carries the binding's sources and the portable core
   built for x86_64 and aarch64 (``prebuilt/<machine>/``: the static archive, the Gloo plugin and its libraries):
   ``pip install distckpt-<version>.tar.gz`` compiles the binding against the core for this machine and links it in
   statically, with only a C++17 compiler and this Python's headers (pybind11 comes as a build requirement).
"""

import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import setuptools
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# The binding's sources and the header: beside this file in an sdist, one level up in a checkout.
SDIST = (HERE / "bindings" / "module.cc").is_file()
ROOT = HERE if SDIST else HERE.parent
HEADER = ROOT / "capi" / "include" / "distckpt" / "distckpt.h"
# An sdist's bundled portable cores, one tree per machine (scripts/build_wheel.sh --sdist).
BUNDLED = HERE / "prebuilt"
# The Gloo plugin: the core loads it, on the first Gloo communicator, from beside the binary that holds the core.
GLOO_PLUGIN = "libdistckpt_gloo.so"


def _bundled_tree() -> Path:
    """The sdist's core for this machine (way 3)."""
    machine = platform.machine()
    tree = BUNDLED / {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)
    if not (tree / "lib" / "libdistckpt.a").is_file():
        have = sorted(p.name for p in BUNDLED.iterdir()) if BUNDLED.is_dir() else []
        raise RuntimeError(
            f"this sdist carries the distckpt core for {', '.join(have) or 'no machine'}, not for {machine}: build the "
            "core from a source checkout (scripts/build_lib.sh) and install with DISTCKPT_PREBUILT=<its tree>"
        )
    return tree


def _prebuilt() -> str:
    """DISTCKPT_PREBUILT, or the sdist's bundled core when it is unset."""
    where = os.environ.get("DISTCKPT_PREBUILT", "")
    if not where and BUNDLED.is_dir():
        return str(_bundled_tree())
    return where


def _version() -> str:
    prebuilt = _prebuilt()
    if prebuilt == "pkg-config":
        return subprocess.check_output(["pkg-config", "--modversion", "distckpt"], text=True).strip()
    header = Path(prebuilt) / "include" / "distckpt" / "distckpt.h" if prebuilt else HEADER
    m = re.search(r'#define DCKPT_VERSION_STRING "([^"]+)"', header.read_text())
    if not m:
        raise RuntimeError(f"cannot find DCKPT_VERSION_STRING in {header}")
    return m.group(1)


class BazelExtension(setuptools.Extension):
    """An extension module that Bazel builds: `target` is a cc_binary(linkshared = 1) label."""

    def __init__(self, name: str, target: str) -> None:
        super().__init__(name, sources=[])
        self.target = target


class BazelBuildExt(build_ext):
    def run(self) -> None:
        prebuilt = _prebuilt()
        if prebuilt:
            for ext in self.extensions:
                self._prebuilt(ext, prebuilt)
            # Always compiled: an extension left in the build directory by an earlier build (a Bazel one, or one
            # against another tree) would otherwise count as up to date and be packaged instead.
            self.force = True
            super().run()  # compiles each extension's sources with the compiler setuptools sets up
            return
        for ext in self.extensions:
            self._build(ext)

    def _prebuilt(self, ext: BazelExtension, where: str) -> None:
        """Turns `ext` into an ordinary C++ extension over an installed core (module docstring, ways 2 and 3)."""
        # Every .cc file in bindings/ is a part of the one module (bindings/BUILD.bazel lists the same files).
        sources = sorted((ROOT / "bindings").glob("*.cc"))
        version_script = ROOT / "bindings" / "_distckpt.lds"
        if not (ROOT / "bindings" / "module.cc").is_file():
            raise RuntimeError(f"DISTCKPT_PREBUILT: the binding's sources in {ROOT / 'bindings'} are missing")
        if where == "pkg-config":
            flags = shlex.split(subprocess.check_output(["pkg-config", "--cflags", "--libs", "distckpt"], text=True))
            include_dirs = [f[2:] for f in flags if f.startswith("-I")]
            library_dirs = [f[2:] for f in flags if f.startswith("-L")]
            link_args = [f for f in flags if not f.startswith(("-I", "-L", "-l"))]
            link_args += [f"-Wl,-rpath,{d}" for d in library_dirs]
            libraries = ["distckpt"]
        else:
            tree = Path(where).resolve()
            # The sdist's core is linked statically; an install tree as DISTCKPT_LINK says (shared by default).
            static = os.environ.get("DISTCKPT_LINK", "static" if BUNDLED.is_dir() else "shared") == "static"
            header = tree / "include" / "distckpt" / "distckpt.h"
            library = tree / "lib" / ("libdistckpt.a" if static else "libdistckpt.so")
            for needed in (header, library):
                if not needed.is_file():
                    raise RuntimeError(
                        f"DISTCKPT_PREBUILT={where}: {needed} is missing (lay the tree out with "
                        "scripts/build_lib.sh, or point DISTCKPT_PREBUILT at an install prefix)"
                    )
            include_dirs = [str(tree / "include")]
            # The Gloo plugin and what it vendors go into the package, and the shared library unless the core is linked
            # in: the extension finds the library beside itself, and the core the plugin beside itself.
            package_dir = Path(self.get_ext_fullpath(ext.name)).parent
            package_dir.mkdir(parents=True, exist_ok=True)
            (package_dir / "libdistckpt.so").unlink(missing_ok=True)
            for native in ([] if static else [library]) + [tree / "lib" / GLOO_PLUGIN]:
                (package_dir / native.name).unlink(missing_ok=True)
                if native.is_file():  # A tree without the plugin still installs; Gloo then says what is missing.
                    shutil.copyfile(native, package_dir / native.name)
                    (package_dir / native.name).chmod(0o755)
            vendored = tree / "lib" / "distckpt.libs"
            shutil.rmtree(package_dir / vendored.name, ignore_errors=True)
            if vendored.is_dir():
                shutil.copytree(vendored, package_dir / vendored.name)
            # What the core and the plugin need of the system (their glibc floors), as the tree records it.
            (package_dir / "PORTABILITY").unlink(missing_ok=True)
            for record in (tree / "share" / "distckpt" / "PORTABILITY", tree / "PORTABILITY"):
                if record.is_file():
                    shutil.copyfile(record, package_dir / "PORTABILITY")
                    break
            if static:
                # The archive holds the core and its C++ runtime with only dckpt_* global: the module needs the C
                # library alone (libm, libdl, pthread for what the core loads at run time).
                library_dirs = []
                ext.extra_objects = [str(library)]
                libraries = ["m", "dl", "pthread"]
                link_args = []
            else:
                library_dirs = [str(tree / "lib")]
                libraries = ["distckpt"]
                link_args = ["-Wl,-rpath,$ORIGIN"]
        ext.sources = [str(source) for source in sources]
        ext.language = "c++"
        # ROOT: the parts include one another as "bindings/....h".
        ext.include_dirs = [str(ROOT)] + include_dirs + _pybind11_includes()
        ext.library_dirs = library_dirs
        ext.libraries = libraries
        ext.extra_compile_args = ["-std=c++17", "-O2", "-fvisibility=hidden", "-Wno-missing-field-initializers"]
        ext.extra_link_args = [f"-Wl,--version-script={version_script}", *link_args]

    def _build(self, ext: BazelExtension) -> None:
        if not (ROOT / "WORKSPACE").is_file():
            raise RuntimeError(f"distckpt's extension is built from a source checkout; {ROOT}/WORKSPACE is missing")
        bazel = os.environ.get("DISTCKPT_BAZEL") or shutil.which("bazel")
        if not bazel:
            raise RuntimeError(
                "bazel not found: run scripts/install_deps.sh (Debian's bazel-bootstrap) or set DISTCKPT_BAZEL"
            )
        startup = []
        if os.environ.get("DISTCKPT_BAZEL_OUTPUT_BASE"):
            startup.append("--output_base=" + os.environ["DISTCKPT_BAZEL_OUTPUT_BASE"])
        # The installing interpreter's headers (python_configure reads PYTHON_BIN_PATH); no bazel-* symlinks in the
        # source tree, so that a pip build never repoints the developer's own.
        flags = [f"--repo_env=PYTHON_BIN_PATH={sys.executable}", "--symlink_prefix=/"]
        flags += shlex.split(os.environ.get("DISTCKPT_BAZEL_FLAGS", ""))
        plugin_target = "//capi:" + GLOO_PLUGIN
        subprocess.check_call([bazel, *startup, "build", *flags, ext.target, plugin_target], cwd=ROOT)
        bin_dir = subprocess.check_output([bazel, *startup, "info", *flags, "bazel-bin"], cwd=ROOT, text=True).strip()
        package, _, name = ext.target.lstrip("/").partition(":")
        built = Path(bin_dir) / package / name
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        # What an earlier DISTCKPT_PREBUILT build copied there is not part of this build (the core is linked in).
        (dest.parent / "libdistckpt.so").unlink(missing_ok=True)
        shutil.rmtree(dest.parent / "distckpt.libs", ignore_errors=True)
        shutil.copyfile(built, dest)  # Bazel's outputs are read-only; the copy is not
        dest.chmod(0o755)
        # The Gloo plugin beside the extension, where the core linked into it looks for it.
        shutil.copyfile(Path(bin_dir) / "capi" / GLOO_PLUGIN, dest.parent / GLOO_PLUGIN)
        (dest.parent / GLOO_PLUGIN).chmod(0o755)


def _pybind11_includes() -> list:
    try:
        import pybind11  # noqa: PLC0415 - the PyPI package, when the build environment has it
    except ImportError:
        if Path("/usr/include/pybind11/pybind11.h").is_file():
            return []  # Debian's pybind11-dev, on the default include path
        raise RuntimeError(
            "DISTCKPT_PREBUILT: the pybind11 headers are missing (pip install pybind11, or the system's pybind11-dev)"
        ) from None
    return [pybind11.get_include()]


setuptools.setup(
    version=_version(),
    ext_modules=[BazelExtension("distckpt._distckpt", "//bindings:_distckpt.so")],
    cmdclass={"build_ext": BazelBuildExt},
)
