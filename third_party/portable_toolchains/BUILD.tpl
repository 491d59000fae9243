# Generated from third_party/portable_toolchains/BUILD.tpl (see toolchains.bzl there).
load("@bazel_tools//tools/cpp:unix_cc_toolchain_config.bzl", "cc_toolchain_config")
load("@rules_cc//cc:defs.bzl", "cc_toolchain", "cc_toolchain_suite")

package(default_visibility = ["//visibility:public"])

filegroup(
    name = "wrappers",
    srcs = glob(["zig-*"]),
)

filegroup(
    name = "gcc_aarch64_wrappers",
    srcs = ["cross-g++-aarch64"],
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

# Debian's cross g++ for AArch64 (libstdc++), linking against the arm64 root's libraries (toolchains.bzl).
cc_toolchain_suite(
    name = "gcc_aarch64",
    toolchains = {
        "aarch64": ":gcc-aarch64",
        "aarch64|gcc": ":gcc-aarch64",
    },
)

cc_toolchain(
    name = "gcc-aarch64",
    all_files = ":gcc_aarch64_wrappers",
    ar_files = ":gcc_aarch64_wrappers",
    as_files = ":gcc_aarch64_wrappers",
    compiler_files = ":gcc_aarch64_wrappers",
    dwp_files = ":empty",
    linker_files = ":gcc_aarch64_wrappers",
    objcopy_files = ":empty",
    strip_files = ":empty",
    supports_param_files = 1,
    toolchain_config = ":gcc-aarch64-config",
    toolchain_identifier = "gcc-aarch64",
)

cc_toolchain_config(
    name = "gcc-aarch64-config",
    abi_libc_version = "glibc_2.36",
    abi_version = "gcc",
    compile_flags = [
        "-fstack-protector",
        "-Wall",
        "-fno-omit-frame-pointer",
        "-Wno-builtin-macro-redefined",
        "-D__DATE__=\"redacted\"",
        "-D__TIMESTAMP__=\"redacted\"",
        "-D__TIME__=\"redacted\"",
    ],
    compiler = "gcc",
    cpu = "aarch64",
    cxx_builtin_include_directories = [
        "/usr/lib/gcc-cross/aarch64-linux-gnu/12/include",
        "/usr/aarch64-linux-gnu/include",
        "/usr/include",
    ],
    cxx_flags = ["-std=c++17"],
    dbg_compile_flags = ["-g"],
    host_system_name = "x86_64-unknown-linux-gnu",
    link_flags = ["-Wl,-z,relro,-z,now"],
    link_libs = [
        "-lstdc++",
        "-lm",
    ],
    opt_compile_flags = [
        "-O2",
        "-DNDEBUG",
        "-ffunction-sections",
        "-fdata-sections",
    ],
    opt_link_flags = ["-Wl,--gc-sections"],
    supports_start_end_lib = False,
    target_libc = "glibc_2.36",
    target_system_name = "aarch64-linux-gnu",
    tool_paths = {
        "gcc": "cross-g++-aarch64",
        "cpp": "/usr/bin/aarch64-linux-gnu-cpp",
        "ar": "/usr/bin/aarch64-linux-gnu-ar",
        "ld": "/usr/bin/aarch64-linux-gnu-ld",
        "nm": "/usr/bin/aarch64-linux-gnu-nm",
        "objcopy": "/usr/bin/aarch64-linux-gnu-objcopy",
        "objdump": "/usr/bin/aarch64-linux-gnu-objdump",
        "strip": "/usr/bin/aarch64-linux-gnu-strip",
        "gcov": "/bin/false",
        "dwp": "/bin/false",
        "llvm-cov": "/bin/false",
    },
    toolchain_identifier = "gcc-aarch64",
)
