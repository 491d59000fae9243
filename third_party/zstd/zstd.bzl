"""The zstd repository: Debian's libzstd-dev (zstd.h and the static archive libzstd.a), linked into the core.

x86_64 takes the host's archive (/usr/lib/x86_64-linux-gnu); AArch64 builds (--config=portable_aarch64,
--config=gcc_aarch64) take the archive of the Debian arm64 root named by --repo_env=DISTCKPT_AARCH64_SYSROOT
(tests/packaging/chroot.sh installs libzstd-dev there). Only C library functions are called by it, so the core still
needs nothing but the C library at run time.
"""

_X86_64 = "/usr/lib/x86_64-linux-gnu/libzstd.a"

def _zstd_impl(rctx):
    for h in ["zstd.h", "zstd_errors.h"]:
        if not rctx.path("/usr/include/" + h).exists:
            fail("zstd: /usr/include/{} is missing (apt-get install libzstd-dev; scripts/install_deps.sh)".format(h))
        rctx.symlink("/usr/include/" + h, "include/" + h)
    if rctx.path(_X86_64).exists:
        rctx.symlink(_X86_64, "x86_64/libzstd.a")
    sysroot = rctx.os.environ.get("DISTCKPT_AARCH64_SYSROOT", "")
    arm = sysroot + "/usr/lib/aarch64-linux-gnu/libzstd.a"
    for cpu, path, why in [
        ("x86_64", _X86_64, "apt-get install libzstd-dev (scripts/install_deps.sh)"),
        ("aarch64", arm, "pass --repo_env=DISTCKPT_AARCH64_SYSROOT=<a Debian arm64 root with libzstd-dev> " +
                         "(tests/packaging/chroot.sh chroot_aarch64 makes one)"),
    ]:
        rctx.delete(cpu)  # from an earlier fetch
        if (cpu == "x86_64" or sysroot) and rctx.path(path).exists:
            rctx.symlink(path, cpu + "/libzstd.a")
        else:
            # Fails only when a build for that CPU needs it, saying what to do.
            rctx.file(cpu + "/BUILD", """genrule(
    name = "missing",
    outs = ["libzstd.a"],
    cmd = "echo 'zstd: no libzstd.a for {cpu} ({path}): {why}' >&2; exit 1",
    visibility = ["//visibility:public"],
)
""".format(cpu = cpu, path = path, why = why))
    rctx.template("BUILD", rctx.attr._build, {
        "%{x86_64}": "x86_64/libzstd.a" if rctx.path("x86_64/libzstd.a").exists else "//x86_64:libzstd.a",
        "%{aarch64}": "aarch64/libzstd.a" if rctx.path("aarch64/libzstd.a").exists else "//aarch64:libzstd.a",
    })

zstd_repository = repository_rule(
    implementation = _zstd_impl,
    environ = ["DISTCKPT_AARCH64_SYSROOT"],
    local = True,
    attrs = {"_build": attr.label(default = "//third_party/zstd:BUILD.repo")},
)
