#!/usr/bin/env python3
"""The fan-out load's bytes read against the plain load's.

N ranks (real processes over Gloo on loopback, tools/launcher's `launch`) load a mostly replicated state
(tests/multiprocess/fanout_worker.cc: ~M MiB replicated on every rank, M/8 sharded by rows, 0.5 MiB loaded by
columns from rows) with the fan-out on (FanoutMode::kAlways: on one host kAuto would not fan out) and off, interleaved, cold cache (pages of the checkpoint evicted with
posix_fadvise DONTNEED) and warm, read with pread (map_files off: every byte from storage counts in bytes_read) and,
warm, through the mapping (the library's default). Every loaded value is checked by the worker. Reports the sum of
bytes read from storage over the ranks, the bytes exchanged, the load's wall time (slowest rank, median of the runs)
and the ratios, as a Markdown table on stdout and in bench/results/<date>-fanout-<host>.md.

    bench/fanout/fanout_bench.py [--ranks 4] [--mib 256] [--runs 3] [--dir /tmp/x] [--round-mib 256] [--no-build]
"""
import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATS = re.compile(r"FANOUT_STATS (.*)")


def bazel_bin():
    return subprocess.check_output(["bazel", "info", "bazel-bin"] + os.environ.get("BENCH_BAZEL_FLAGS", "").split(),
                                   cwd=ROOT, text=True, stderr=subprocess.DEVNULL).strip()


def evict(path):
    os.sync()  # the worker saves without fsync: dirty pages cannot be evicted
    for dirpath, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def launch(tools, ranks, args):
    launch_bin, worker = tools
    start = time.monotonic()
    out = subprocess.run([launch_bin, "-n", str(ranks), "--timeout", "600", "--", worker] + args, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - start
    if out.returncode != 0:
        sys.exit("fanout_bench: %s failed:\n%s" % (" ".join(args), out.stdout))
    rows = []
    for line in out.stdout.splitlines():
        m = STATS.search(line)
        if m:
            rows.append({k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())})
    return rows, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mib", type=int, default=256, help="replicated MiB (the state is ~1.2x this)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--round-mib", type=int, default=256,
                    help="fan-out bytes a rank receives per exchange round (ReadOptions::fanout_round_bytes)")
    ap.add_argument("--dir", default="", help="work directory (default: a fresh one under /tmp)")
    ap.add_argument("--no-build", action="store_true")
    a = ap.parse_args()

    if not a.no_build:
        subprocess.check_call(["bazel", "build"] + os.environ.get("BENCH_BAZEL_FLAGS", "").split() +
                              ["//tests/multiprocess:fanout_worker", "//tools/launcher:launch"], cwd=ROOT)
    b = bazel_bin()
    tools = (os.path.join(b, "tools/launcher/launch"), os.path.join(b, "tests/multiprocess/fanout_worker"))
    work = a.dir or tempfile.mkdtemp(prefix="fanout-bench-")
    ckpt = os.path.join(work, "ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    launch(tools, a.ranks, ["--mode", "save", "--path", ckpt, "--mib", str(a.mib)])

    cases = [("cold", "pread"), ("warm", "pread"), ("warm", "mapped")]
    samples = {}  # (cache, io, fanout) -> list of (bytes_read, mapped, received, sent, slowest rank s, wall s)
    for run in range(a.runs):
        for cache, io in cases:
            order = (1, 0) if run % 2 == 0 else (0, 1)
            for fanout in order:
                if cache == "cold":
                    evict(ckpt)
                else:  # warm: load once untimed
                    launch(tools, a.ranks, ["--mode", "load", "--path", ckpt, "--mib", str(a.mib), "--fanout", "0",
                                            "--map", "1" if io == "mapped" else "0"])
                rows, wall = launch(tools, a.ranks, [
                    "--mode", "load", "--path", ckpt, "--mib", str(a.mib), "--fanout", str(fanout),
                    "--map", "1" if io == "mapped" else "0", "--round-kib", str(a.round_mib * 1024)])
                assert len(rows) == a.ranks, rows
                samples.setdefault((cache, io, fanout), []).append((
                    sum(r["bytes_read"] for r in rows), sum(r["mapped"] for r in rows),
                    sum(r["received"] for r in rows), sum(r["sent"] for r in rows),
                    max(r["seconds"] for r in rows), wall))

    mib = 1 << 20
    lines = [
        "# fan-out load: bytes read from storage, fan-out on vs off",
        "",
        "%s, %s, %d CPUs; %d ranks over Gloo loopback, %d MiB replicated state (~%.0f MiB per rank to load), "
        "fanout_round_bytes %d MiB; median of %d runs; checksums verified; every value checked." % (
            datetime.date.today().isoformat(), platform.node(), os.cpu_count(), a.ranks, a.mib,
            samples[("cold", "pread", 0)][0][0] / a.ranks / mib, a.round_mib, a.runs),
        "",
        "| cache | I/O | fan-out | bytes read, all ranks (MiB) | mapped (MiB) | received from peers (MiB) | "
        "sent to peers (MiB) | load s (slowest rank) | launch-to-exit s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    med = {}
    for cache, io in cases:
        for fanout in (0, 1):
            s = samples[(cache, io, fanout)]
            m = [statistics.median(x[i] for x in s) for i in range(6)]
            med[(cache, io, fanout)] = m
            lines.append("| %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.3f | %.2f |" % (
                cache, io, "on" if fanout else "off", m[0] / mib, m[1] / mib, m[2] / mib, m[3] / mib, m[4], m[5]))
    lines += ["", "| cache | I/O | storage bytes off/on | load time off/on |", "|---|---|---|---|"]
    for cache, io in cases:
        off, on = med[(cache, io, 0)], med[(cache, io, 1)]
        storage_off, storage_on = off[0] + off[1], on[0] + on[1]
        lines.append("| %s | %s | %.2fx | %.2fx |" % (cache, io, storage_off / max(storage_on, 1), off[4] / on[4]))
    lines += ["", "Storage bytes = bytes_read + bytes_mapped (mapped: delivered from the page cache through a "
              "mapping). A time ratio above 1 means the fan-out is faster."]
    text = "\n".join(lines) + "\n"
    print(text)
    out = os.path.join(ROOT, "bench", "results", "%s-fanout-%s.md" % (datetime.date.today().isoformat(),
                                                                       platform.node() or "host"))
    with open(out, "w") as f:
        f.write(text)
    print("written to", os.path.relpath(out, ROOT))
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
