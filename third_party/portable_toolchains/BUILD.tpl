# Generated from third_party/portable_toolchains/BUILD.tpl (see toolchains.bzl there).
load("@bazel_tools//tools/cpp:unix_cc_toolchain_config.bzl", "cc_toolchain_config")
load("@rules_cc//cc:defs.bzl", "cc_toolchain", "cc_toolchain_suite")

package(default_visibility = ["//visibility:public"])

filegroup(
    name = "wrappers",
    srcs = glob(["zig-*"]),
)

filegroup(
    name = "empty",
    srcs = [],
)

cc_toolchain_suite(
    name = "zig",
    toolchains = {
        "k8": ":zig-k8",
        "k8|clang": ":zig-k8",
        "aarch64": ":zig-aarch64",
        "aarch64|clang": ":zig-aarch64",
    },
)

[cc_toolchain(
    name = "zig-" + cpu,
    all_files = ":wrappers",
    ar_files = ":wrappers",
    as_files = ":wrappers",
    compiler_files = ":wrappers",
    dwp_files = ":empty",
    linker_files = ":wrappers",
    objcopy_files = ":empty",
    strip_files = ":empty",
    supports_param_files = 1,
    toolchain_config = ":zig-config-" + cpu,
    toolchain_identifier = "zig-" + cpu,
) for cpu in ["k8", "aarch64"]]

[cc_toolchain_config(
    name = "zig-config-" + cpu,
    abi_libc_version = "glibc_2.28",
    abi_version = "clang",
    compile_flags = [
        "-fstack-protector",
        "-Wall",
        "-fno-omit-frame-pointer",
        # Reproducible outputs.
        "-Wno-builtin-macro-redefined",
        "-D__DATE__=\"redacted\"",
        "-D__TIMESTAMP__=\"redacted\"",
        "-D__TIME__=\"redacted\"",
    ],
    compiler = "clang",
    cpu = cpu,
    # zig's own headers (glibc's of the target version, libc++, the compiler's) all sit under its lib/.
    cxx_builtin_include_directories = ["%{zig_lib}", "%{cache}"],
    cxx_flags = ["-std=c++17"],
    dbg_compile_flags = ["-g"],
    host_system_name = "x86_64-unknown-linux-gnu",
    # -O2: zig builds the libc++ it links in at the optimisation level the link names (none: a debug build).
    link_flags = ["-O2", "-Wl,-z,relro,-z,now"],
    link_libs = ["-lm"],
    opt_compile_flags = [
        "-O2",
        "-DNDEBUG",
        "-ffunction-sections",
        "-fdata-sections",
    ],
    opt_link_flags = ["-Wl,--gc-sections"],
    supports_start_end_lib = False,
    target_libc = "glibc_2.28",
    target_system_name = triple,
    tool_paths = {
        "gcc": "zig-cc-" + cpu,
        "cpp": "/bin/false",
        "ar": "zig-ar",
        "ld": "zig-cc-" + cpu,
        "nm": "/usr/bin/nm",
        "objcopy": "/usr/bin/objcopy",
        "objdump": "/usr/bin/objdump",
        "strip": "/usr/bin/strip",
        "gcov": "/bin/false",
        "dwp": "/bin/false",
        "llvm-cov": "/bin/false",
    },
    toolchain_identifier = "zig-" + cpu,
) for cpu, triple in [
    ("k8", "x86_64-linux-gnu"),
    ("aarch64", "aarch64-linux-gnu"),
]]
