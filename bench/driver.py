"""bench/run's driver: every scenario of bench/README.md, distckpt against its peers and the physical limit, in one
run on one machine. Writes bench/results/<date>-<host>.md (tables, ratios, targets) and a PNG bar chart.

Each figure is the median of --runs runs (min and max shown). Within a run the systems go in a rotating order, so
drift of the (shared, noisy) disk affects them alike. Run through bench/run, which builds the binaries and the venv.
"""

import argparse
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import spec as specmod  # noqa: E402

PY = sys.executable
# The crates of the Rust crate's optional features come from Debian's packages where they are installed (this
# project's machines reach no crates.io; rust/debian-registry.toml, as rust/run_tests.sh uses it): cargo resolves
# them for the workspace even with the features off.
CARGO_SOURCE = (["--config", os.path.join(ROOT, "rust", "debian-registry.toml")]
                if os.path.isdir("/usr/share/cargo/registry") else [])
GiB = 1 << 30
MiB = 1 << 20


def log(*a):
    print("[bench %s]" % time.strftime("%H:%M:%S"), *a, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=isinstance(cmd, str), check=True, capture_output=True, text=True, **kw).stdout


def parse_result(out, what):
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError("%s printed no RESULT line:\n%s" % (what, out[-3000:]))


def run_result(cmd, what, env=None, timeout=3600):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s failed (exit %d):\n%s\n%s" % (what, p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
    return parse_result(p.stdout, what)


def fio_busy(wall, startup):
    """fio's wall time less its start-up cost; the start-up run (1 MiB per job) is noisy on a busy machine, so it
    never takes more than a quarter of the measured time (it matters only for tiny --quick sizes)."""
    return wall - min(startup, 0.25 * wall)


class Bench:
    def __init__(self, args):
        self.args = args
        self.bin = args.bin
        self.work = args.dir
        self.launch = os.path.join(self.bin, "tools/launcher/launch")
        self.worker = os.path.join(self.bin, "bench/worker/bench_worker")
        self.plan_scale = os.path.join(self.bin, "bench/plan_scale/plan_scale")
        self.samples = {}  # key -> list of values
        self.extra = {}
        self.notes = []
        self.can_drop = os.access("/proc/sys/vm/drop_caches", os.W_OK)

    # ---- helpers ----
    def add(self, key, value):
        self.samples.setdefault(key, []).append(value)

    def drop_caches(self):
        """Cold cache: the kernel's drop_caches where allowed (root), else evict every file under the work dir."""
        os.sync()
        if self.can_drop:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return
        for dp, _, files in os.walk(self.work):
            for fn in files:
                try:
                    fd = os.open(os.path.join(dp, fn), os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
                except OSError:
                    pass

    def dckpt(self, n, mode, d, *extra):
        os.makedirs(d, exist_ok=True)
        cmd = [self.launch, "-n", str(n), "--timeout", "3600", "--", self.worker, "--mode", mode,
               "--spec", self.spec_path, "--dir", d] + list(extra)
        return run_result(cmd, "distckpt %s" % mode)

    def peer(self, n, mode, d, *extra):
        os.makedirs(d, exist_ok=True)
        port = random.randint(20000, 40000)
        procs = []
        for r in range(n):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([PY, os.path.join(HERE, "peers.py"), mode, "--spec", self.spec_path,
                                           "--dir", d] + list(extra), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=3600) for p in procs]
        for p, (o, e) in zip(procs, outs):
            if p.returncode != 0:
                raise RuntimeError("DCP %s failed:\n%s\n%s" % (mode, o[-3000:], e[-3000:]))
        return parse_result(outs[0][0], "DCP " + mode)

    def py(self, mode, *extra):
        if "--dir" in extra:
            os.makedirs(extra[list(extra).index("--dir") + 1], exist_ok=True)
        return run_result([PY, os.path.join(HERE, "peers.py"), mode] + list(extra), mode)

    def fio(self, name, rw, direct, size_per_job, jobs, engine="psync", iodepth=1):
        cmd = ["fio", "--name=" + name, "--directory=" + self.fio_dir, "--rw=" + rw, "--bs=1M",
               "--size=%d" % size_per_job, "--numjobs=%d" % jobs, "--ioengine=" + engine, "--iodepth=%d" % iodepth,
               "--group_reporting", "--output-format=json", "--direct=%d" % direct]
        if rw == "write":
            cmd.append("--end_fsync=1")
        t0 = time.perf_counter()
        out = sh(cmd)
        wall = time.perf_counter() - t0
        j = json.loads(out[out.index("{"):])["jobs"][0]
        return wall, j["write" if rw == "write" else "read"]["bw_bytes"]

    # ---- scenarios ----
    def machine(self):
        m = {}
        m["host"] = socket.gethostname()
        m["kernel"] = platform.release()
        m["cores"] = os.cpu_count()
        try:
            m["cpu"] = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
        except (OSError, IndexError):
            m["cpu"] = "?"
        mem = {l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/meminfo")}
        m["memory"] = "%.1f GiB" % (int(mem["MemTotal"].split()[0]) / (1 << 20))
        st = os.statvfs(self.work)
        m["disk_free"] = "%.1f GiB" % (st.f_bavail * st.f_frsize / GiB)
        try:
            src = sh(["findmnt", "-n", "-o", "SOURCE,FSTYPE,SIZE", "--target", self.work]).strip()
        except Exception:  # noqa: BLE001
            src = "?"
        m["filesystem"] = src
        try:
            m["torch"] = sh([PY, "-c", "import torch, safetensors; print(torch.__version__, safetensors.__version__)"]
                            ).strip()
        except Exception:  # noqa: BLE001
            m["torch"] = "?"
        m["fio"] = sh(["fio", "--version"]).strip()
        m["cold_cache"] = ("drop_caches (sync; echo 3 > /proc/sys/vm/drop_caches)" if self.can_drop
                           else "posix_fadvise(DONTNEED) on every file (no root)")
        self.machine_info = m

    def memcpy(self):
        r = run_result([self.worker, "--mode", "memcpy", "--mib", str(self.args.memcpy_mib)], "memcpy")
        self.add("memcpy_1t", r["one_thread_Bps"])
        self.add("memcpy_all", r["all_threads_Bps"])
        self.add("hash_all", r["hash_all_threads_Bps"])
        self.add("hash_copy_all", r["hash_copy_all_threads_Bps"])

    def save_round(self, k):
        """(a) and (e): durable save, 4 ranks; fio write; safetensors save. Leaves checkpoints for the load round."""
        total = self.total_bytes
        ranks = self.args.save_ranks
        systems = ["fio", "dckpt", "dcp1", "dckpt_unaligned", "dcp4", "st"]
        order = systems[k % len(systems):] + systems[:k % len(systems)]
        for s in order:
            if s == "fio":
                shutil.rmtree(self.fio_dir, ignore_errors=True)
                os.makedirs(self.fio_dir)
                # fio's own bandwidth leaves out the end_fsync; the physical limit with fsync is bytes over the
                # whole run (fsync included) minus fio's fixed start-up cost, measured with 1 MiB per job.
                tiny, _ = self.fio("startup", "write", 0, MiB, ranks)
                wall, bw = self.fio("seqwrite", "write", 0, total // ranks, ranks)
                self.add("fio_write_fsync", total / fio_busy(wall, tiny))
                self.add("fio_write_nofsync_reported", bw)
                # The same with O_DIRECT and a deep queue (io_uring, 16 in flight per job), also fsync'd at the end:
                # the best this disk does, whatever the I/O path.
                tiny, _ = self.fio("startup", "write", 1, MiB, ranks, "io_uring", 16)
                wall, bw = self.fio("deepwrite", "write", 1, total // ranks, ranks, "io_uring", 16)
                self.add("fio_write_direct_qd16", total / fio_busy(wall, tiny))
                for f in os.listdir(self.fio_dir):
                    if not f.startswith("seqwrite"):
                        os.remove(os.path.join(self.fio_dir, f))
            elif s == "dckpt_unaligned":
                # Buffers 64 bytes past a page boundary, as torch's CPU allocator hands them out.
                r = self.dckpt(ranks, "save", os.path.join(self.work, "dckpt"), "--unaligned")
                self.add("dckpt_save_unaligned", r["bytes"] / r["seconds"])
            elif s == "dckpt":
                r = self.dckpt(ranks, "save", os.path.join(self.work, "dckpt"))
                self.add("dckpt_save", r["bytes"] / r["seconds"])
                self.add("dckpt_save_s", r["seconds"])
                self.ckpt_bytes = r["bytes"]
                self.add("rss_over_dckpt_save", max(p - b for p, b in zip(r["rss_peak"], r["rss_base"])))
                self.extra["dckpt_state_per_rank_save"] = max(r["state_bytes"])
                self.extra["dckpt_metadata_bytes"] = r["metadata_bytes"]
            elif s in ("dcp1", "dcp4"):
                t = 1 if s == "dcp1" else 4
                shutil.rmtree(os.path.join(self.work, s), ignore_errors=True)
                r = self.peer(ranks, "dcp-save", os.path.join(self.work, s), "--threads", str(t))
                self.add(s + "_save", self.total_bytes_spec / r["seconds"])
                self.add("rss_over_" + s + "_save", max(p - b for p, b in zip(r["rss_peak"], r["rss_base"])))
                self.extra["dcp_bytes_on_disk"] = r["bytes_on_disk"]
            elif s == "st":
                r = self.py("st-save", "--spec", self.spec_path, "--dir", os.path.join(self.work, "st"))
                self.add("st_save", r["bytes"] / r["seconds"])

    def load_round(self, k):
        """(b) and (e): resharded load on 3 ranks, cold then warm; fio reads of the fio files; safetensors load."""
        ranks = self.args.load_ranks
        jobs = self.args.save_ranks
        per_job = self.total_bytes // jobs
        systems = ["fio", "dckpt", "dcp", "st"]
        order = systems[k % len(systems):] + systems[:k % len(systems)]
        for s in order:
            if s == "fio":
                self.drop_caches()
                wall, bw = self.fio("seqwrite", "read", 0, per_job, jobs)
                self.add("fio_read_buffered", bw)
                self.drop_caches()
                wall, bw = self.fio("seqwrite", "read", 1, per_job, jobs)
                self.add("fio_read_direct", bw)
                wall, bw = self.fio("seqwrite", "read", 1, per_job, jobs, "io_uring", 16)
                self.add("fio_read_direct_qd16", bw)
            elif s == "dckpt":
                d = os.path.join(self.work, "dckpt")
                self.drop_caches()
                r = self.dckpt(ranks, "load", d)
                if r["bad"]:
                    raise RuntimeError("distckpt loaded wrong values")
                self.add("dckpt_load_cold", r["bytes"] / r["seconds"])
                self.add("rss_over_dckpt_load", max(p - b for p, b in zip(r["rss_peak"], r["rss_base"])))
                self.extra["dckpt_state_per_rank_load"] = max(r["state_bytes"])
                self.extra["dckpt_load_bytes_read"] = sum(r["bytes_read"])
                r = self.dckpt(ranks, "load", d, "--no-check")
                self.add("dckpt_load_warm", r["bytes"] / r["seconds"])
                r = self.dckpt(ranks, "load", d, "--no-check", "--no-verify")
                self.add("dckpt_load_warm_noverify", r["bytes"] / r["seconds"])
                # The least work of the same warm reshard (bench_worker.cc, RunReshardLimit): the ranks' bytes
                # from the page cache (mapped, or pread per block) or from private copies of the files, each
                # block hashed once, nothing else. The page cache is left as the loads above left it.
                r = self.dckpt(ranks, "reshard-limit", d, "--repeat", "1", "--private")
                if r["bad"]:
                    raise RuntimeError("the reshard limit copied wrong values")
                self.add("reshard_least_map", r["bytes"] / r["map_seconds"][0])
                self.add("reshard_least_read", r["bytes"] / r["read_seconds"][0])
                self.add("reshard_least_private", r["bytes"] / r["private_seconds"][0])
            elif s == "dcp":
                d = os.path.join(self.work, "dcp4")
                self.drop_caches()
                r = self.peer(ranks, "dcp-load", d)
                if r["bad"]:
                    raise RuntimeError("DCP loaded wrong values")
                self.add("dcp_load_cold", r["bytes"] / r["seconds"])
                self.add("rss_over_dcp_load", max(p - b for p, b in zip(r["rss_peak"], r["rss_base"])))
                r = self.peer(ranks, "dcp-load", d)
                self.add("dcp_load_warm", r["bytes"] / r["seconds"])
            elif s == "st":
                d = os.path.join(self.work, "st")
                self.drop_caches()
                r = self.py("st-load", "--dir", d)
                self.add("st_load_cold", r["bytes"] / r["seconds"])
                r = self.py("st-load", "--dir", d)
                self.add("st_load_warm", r["bytes"] / r["seconds"])

    def async_round(self, k):
        """(c): async save stall and total, against DCP's async_save and a memcpy of each rank's state."""
        ranks = self.args.save_ranks
        for s in (["dckpt", "dcp"] if k % 2 == 0 else ["dcp", "dckpt"]):
            d = os.path.join(self.work, "async-" + s)
            shutil.rmtree(d, ignore_errors=True)
            if s == "dckpt":
                r = self.dckpt(ranks, "async", d)
                self.add("memcpy_state_fresh", r["memcpy_fresh"])
                self.add("memcpy_state_prefaulted", r["memcpy_prefaulted"])
                self.add("rss_over_dckpt_async", max(p - b for p, b in zip(r["rss_peak"], r["rss_base"])))
                self.extra["dckpt_state_per_rank_async"] = max(r["state_bytes"])
            else:
                r = self.peer(ranks, "dcp-async", d, "--threads", "4")
            for key in ("first_stall", "first_total", "stall", "total"):
                self.add("%s_async_%s" % (s, key), r[key])
            shutil.rmtree(d, ignore_errors=True)

    def metadata_scale(self):
        """(d): 1M chunks (plan_scale's layout at 1,024 ranks x 2,000 tensors)."""
        tensors = self.args.meta_tensors
        d = os.path.join(self.work, "meta")
        shutil.rmtree(d, ignore_errors=True)
        out = sh([self.plan_scale, "--tensors=%d" % tensors, "--repeat=%d" % self.args.runs, "--write=" + d])
        self.extra["plan_scale_output"] = out.strip()
        for line in out.splitlines():
            if line.startswith("MakeGlobalPlan"):
                self.extra["dckpt_plan_median"] = float(line.split("median ")[1].split(" s")[0])
                self.extra["dckpt_plan_best"] = float(line.split("best ")[1].split(" s")[0])
            if "chunks," in line and "files" in line:
                self.extra["dckpt_chunks"] = int(line.split()[0])
        self.extra["dckpt_meta_bytes"] = os.path.getsize(os.path.join(d, "metadata.dckpt"))
        name = "model.layers.%d.attn.o_proj.weight" % (tensors // 20)
        for _ in range(self.args.runs):
            r = run_result([self.worker, "--mode", "open", "--dir", d, "--name", name, "--repeat", "1"], "open")
            self.add("dckpt_open_lookup", r["seconds"][0])
        shutil.rmtree(d, ignore_errors=True)
        if self.args.skip_dcp_plan:
            return
        dd = os.path.join(self.work, "dcp-meta")
        os.makedirs(dd, exist_ok=True)
        # One run: at 1M chunks DCP's planning and its pickle load take minutes each (bench/NOTES.md).
        r = run_result([PY, os.path.join(HERE, "peers.py"), "dcp-plan", "--tensors", str(tensors), "--dir", dd,
                        "--repeat", "1"], "dcp-plan", timeout=7200)
        self.extra["dcp_plan"] = r["plan"]
        self.extra["dcp_chunks"] = r["chunks"]
        self.extra["dcp_meta_bytes"] = r["metadata_bytes"]
        for v in r["open_lookup"]:
            self.add("dcp_open_lookup", v)
        shutil.rmtree(dd, ignore_errors=True)

    def zero_copy(self):
        """(f): time to first tensor and full read of a 1 GiB tensor: Rust view() against safetensors."""
        gib = self.args.view_gib
        d = os.path.join(self.work, "view")
        os.makedirs(d, exist_ok=True)
        stfile = os.path.join(d, "weight.safetensors")
        self.py("st-make-view-file", "--file", stfile, "--gib", str(gib))
        view_bench = self.view_bench_cmd(d, gib)
        for k in range(self.args.runs):
            for s in (["rust", "st"] if k % 2 == 0 else ["st", "rust"]):
                if s == "st":
                    for cold in (True, False):
                        r = self.py("st-view", "--file", stfile, *(["--cold"] if cold else []))
                        tag = "cold" if cold else "warm"
                        self.add("st_first_" + tag, r["first"])
                        self.add("st_full_" + tag, r["full"])
                elif view_bench:
                    out = sh(view_bench, cwd=os.path.join(ROOT, "rust"), env=self.rust_env)
                    rows = {}
                    for line in out.splitlines():
                        for key, label in (("first", "view(): first element read"),
                                           ("full", "view(): every element summed")):
                            if line.startswith(label):
                                cold, warm = line[len(label):].split()[0::2], line[len(label):].split()[1::2]
                                rows[key] = (float(cold[0]) * (1e-3 if warm[0] == "ms" else 1e-6),
                                             float(cold[1]) * (1e-3 if warm[1] == "ms" else 1e-6))
                    for key, (c, w) in rows.items():
                        self.add("view_%s_cold" % key, c)
                        self.add("view_%s_warm" % key, w)
        shutil.rmtree(d, ignore_errors=True)

    def view_bench_cmd(self, d, gib, build_only=False):
        if shutil.which("cargo") is None or self.args.skip_rust:
            self.notes.append("(f), (g): cargo is missing or --skip-rust: the Rust figures are absent.")
            return None
        lib = os.path.join(ROOT, "build", "dist", "lib")
        self.rust_env = dict(os.environ, DISTCKPT_LIB_DIR=lib, LD_LIBRARY_PATH=lib,
                             PKG_CONFIG_PATH=os.path.join(lib, "pkgconfig"))
        cmd = ["cargo", "run", "--offline", *CARGO_SOURCE, "--release", "-q", "-p", "distckpt", "--example",
               "view_bench", "--", "--gib", str(gib), "--dir", d, "--keep", "--reps", "2"]
        if build_only:
            try:
                sh(["cargo", "build", "--offline", *CARGO_SOURCE, "--release", "-q", "-p", "distckpt", "--examples"],
                   cwd=os.path.join(ROOT, "rust"), env=self.rust_env)
                return cmd
            except subprocess.CalledProcessError as e:
                self.notes.append("(g): the Rust examples failed to build: %s" % e.stderr[-500:])
                return None
        try:
            sh(cmd, cwd=os.path.join(ROOT, "rust"), env=self.rust_env)  # builds, and saves the checkpoint once
        except subprocess.CalledProcessError as e:
            self.notes.append("(f): the Rust view_bench failed to build or run: %s" % e.stderr[-500:])
            return None
        return cmd

    def whole_model(self):
        """(g): a whole model loaded in one process, as an inference server does before serving: Rust map_all (zero
        copy, verified in place) and read_all (verified copies) against safetensors' load_file (mmap and pread
        backends), cold and warm, with fio reads of the same data file as the cold limit. Every load reports the sum of
        one byte per page of every tensor; all must agree with what the model was made with."""
        d = os.path.join(self.work, "model")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        bench = self.model_bench_cmd()
        if bench is None:
            return
        made = json.loads(sh(bench + ["make", "--dir", d, "--gib", str(self.args.model_gib)],
                             cwd=os.path.join(ROOT, "rust"), env=self.rust_env).strip().splitlines()[-1])
        self.extra["model_bytes"] = made["bytes"]
        self.extra["model_tensors"] = made["tensors"]
        data = os.path.join(d, "ckpt", "data-00000.bin")
        stfile = os.path.join(d, "st", "model-00001-of-00001.safetensors")
        size_mib = os.path.getsize(data) // MiB
        systems = ["fio", "map_all", "read_all", "st_mmap", "st_pread"]
        for k in range(self.args.runs):
            for s in systems[k % len(systems):] + systems[:k % len(systems)]:
                for cold in (True, False):
                    tag = "cold" if cold else "warm"
                    if s == "fio":
                        if not cold:
                            continue
                        for key, direct, engine, depth in (("buffered", 0, "psync", 1), ("direct", 1, "psync", 1),
                                                           ("direct_qd16", 1, "io_uring", 16)):
                            self.drop_caches()
                            out = sh(["fio", "--name=model", "--filename=" + data, "--readonly", "--rw=read",
                                      "--bs=1M", "--size=%dM" % size_mib, "--direct=%d" % direct,
                                      "--ioengine=" + engine, "--iodepth=%d" % depth, "--output-format=json"])
                            j = json.loads(out[out.index("{"):])["jobs"][0]
                            self.add("model_fio_" + key, j["read"]["bw_bytes"])
                        continue
                    if cold:
                        self.drop_caches()
                    if s.startswith("st_"):
                        r = self.py("st-model", "--file", stfile, "--backend", s[3:], *(["--cold"] if cold else []))
                    else:
                        out = sh(bench + ["run", "--dir", d, "--mode", s] + (["--cold"] if cold else []),
                                 cwd=os.path.join(ROOT, "rust"), env=self.rust_env)
                        r = json.loads(out.strip().splitlines()[-1])
                    if r["check"] != made["check"] or r["bytes"] != made["bytes"]:
                        raise RuntimeError("(g) %s loaded wrong bytes: check %s, want %s" % (s, r["check"],
                                                                                          made["check"]))
                    self.add("model_%s_%s" % (s, tag), r["seconds"])
        shutil.rmtree(d, ignore_errors=True)

    def model_bench_cmd(self):
        if self.view_bench_cmd(self.work, 0, build_only=True) is None:
            return None
        return ["cargo", "run", "--offline", *CARGO_SOURCE, "--release", "-q", "-p", "distckpt", "--example",
                "model_bench", "--"]

    # ---- main ----
    def run(self):
        a = self.args
        os.makedirs(self.work, exist_ok=True)
        self.fio_dir = os.path.join(self.work, "fio")
        spec = specmod.make_spec(a.size)
        self.spec_path = os.path.join(self.work, "spec.txt")
        specmod.write_spec(self.spec_path, spec)
        self.total_bytes_spec = sum(specmod.nbytes(e) for e in spec)
        self.total_bytes = self.total_bytes_spec
        self.replicated_share = sum(specmod.nbytes(e) for e in spec if e[2]) / self.total_bytes_spec
        self.num_tensors = len(spec)
        self.machine()
        log("machine:", self.machine_info)
        log("state: %d tensors, %.2f GiB, %.0f%% replicated" % (len(spec), self.total_bytes / GiB,
                                                                  100 * self.replicated_share))
        t0 = time.time()
        only = set(a.only.split(",")) if a.only else None
        for k in range(a.runs):
            log("run %d/%d" % (k + 1, a.runs))
            self.memcpy()
            if not only or only & {"a", "b", "e"}:
                self.save_round(k)
                log("  save round done", self.summary_line(["fio_write_fsync", "dckpt_save", "dcp1_save", "dcp4_save"]))
                self.load_round(k)
                log("  load round done", self.summary_line(["fio_read_buffered", "dckpt_load_cold", "dcp_load_cold",
                                                            "dckpt_load_warm"]))
            if not only or "c" in only:
                self.async_round(k)
                log("  async round done", self.summary_line(["dckpt_async_stall", "dcp_async_stall",
                                                             "memcpy_state_fresh"]))
        for d in ("dckpt", "dcp1", "dcp4", "st", "fio"):
            shutil.rmtree(os.path.join(self.work, d), ignore_errors=True)
        if not only or "d" in only:
            log("metadata scale")
            self.metadata_scale()
        if not only or "f" in only:
            log("zero-copy read")
            self.zero_copy()
        if not only or "g" in only:
            log("whole-model load")
            self.whole_model()
        self.elapsed = time.time() - t0
        self.report()

    def summary_line(self, keys):
        return " ".join("%s=%.3g" % (k, self.samples[k][-1]) for k in keys if k in self.samples)

    # ---- report ----
    def stat(self, key):
        v = self.samples.get(key)
        if not v:
            return None
        return statistics.median(v), min(v), max(v), len(v)

    def report(self):
        import report
        path_md, path_png = report.write(self)
        report.save_state(self, os.path.splitext(path_md)[0] + ".json")
        log("wrote", path_md, "and", path_png)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", required=True, help="Bazel's bazel-bin (-c opt)")
    ap.add_argument("--dir", default="/var/tmp/distckpt-bench", help="work directory (on the disk to measure)")
    ap.add_argument("--quick", action="store_true", help="small sizes, to check that everything runs")
    ap.add_argument("--size-gib", type=float, default=2.0, help="checkpoint size (scaled down to the free disk)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated scenarios (a,b,c,d,e,f,g); default all")
    ap.add_argument("--skip-rust", action="store_true")
    ap.add_argument("--skip-dcp-plan", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args()
    a.save_ranks, a.load_ranks = 4, 3
    # The reader's bounce buffers: one 8 MiB segment per I/O thread (core/engine/reader.cc, DefaultIoThreads).
    a.io_pool_bytes = min(16, max(4, 2 * (os.cpu_count() or 1))) * (8 * MiB + 4096)
    free = shutil.disk_usage(os.path.dirname(a.dir.rstrip("/")) or "/").free
    a.size = int(a.size_gib * GiB)
    if a.quick:
        a.size, a.meta_tensors, a.view_gib, a.memcpy_mib, a.model_gib = 128 * MiB, 100, 1, 256, 0.5
    else:
        a.meta_tensors, a.view_gib, a.memcpy_mib, a.model_gib = 2000, 1, 1024, 2.0
    # Scenarios keep about 5 copies of the state on disk at once (distckpt, two DCP, safetensors, fio).
    if a.size * 6 > free:
        a.size = int(free / 6)
        print("bench: only %.1f GiB free: checkpoint size scaled down to %.2f GiB" % (free / GiB, a.size / GiB))
    a.quick_mode = a.quick
    Bench(a).run()


if __name__ == "__main__":
    main()
