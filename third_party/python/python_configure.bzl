"""Finds the Python headers through `python3-config --includes` and exposes them as @local_python//:headers."""

def _python_configure_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH", "python3")
    res = ctx.execute([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include']); print(sysconfig.get_config_var('EXT_SUFFIX'))"])
    if res.return_code != 0:
        fail("python_configure: cannot run %s: %s" % (python, res.stderr))
    lines = res.stdout.strip().split("\n")
    include_dir = lines[0]
    ext_suffix = lines[1] if len(lines) > 1 else ".so"
    ctx.symlink(include_dir, "python_include")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)
""")
    ctx.file("defs.bzl", "PY_EXT_SUFFIX = %r\n" % ext_suffix)

python_configure = repository_rule(
    implementation = _python_configure_impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)
