"""The GPU benchmark: distckpt's device data path against the hardware's limits and against DCP, in one run.

Run by scripts/gpu_check.sh on a GPU machine (or alone: ``python bench/gpu/gpu_bench.py --out DIR``). A state of
``--gib`` GiB of CUDA tensors on one GPU is:

- staged to pinned host memory by ``distckpt.async_save`` (the call's stall), against a pinned ``cudaMemcpy`` D2H of
  the same bytes (torch ``copy_(non_blocking=True)`` into pinned tensors): target throughput >= 0.8x;
- snapshotted on the device by ``async_save(device_snapshot=True)`` (the stall), against a device-to-device copy of
  the same bytes: target stall <= 1.2x;
- saved (``distckpt.save``) and loaded back resharded into device memory (each tensor as column halves), against fio
  on the same directory (sequential 1 MiB writes with fsync, and reads after dropping the page cache where allowed);
- saved, async-saved and loaded by ``torch.distributed.checkpoint`` (DCP) on the same CUDA state in the same run.

Every save is loaded back and compared with the source on the device. Writes ``gpu_bench.json`` (every figure, each
target with its verdict) and ``gpu_bench.md`` (the same as tables) to ``--out``; exits 0 unless something failed to
run or a value differed (a target missed is reported, not an exit status). Without torch or a GPU it writes a
"skipped" record saying why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

GIB = 1 << 30


def now() -> float:
    return time.perf_counter()


def drop_caches() -> bool:
    """Drops the page cache (root only); True if it was dropped."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fio_figures(directory: str, size: int) -> Dict[str, Any]:
    """Sequential write (1 MiB blocks, fsync at the end) and read of one file in ``directory``: fio where installed,
    else the same pattern with os.write/os.read (named as such)."""
    path = os.path.join(directory, "fio.dat")
    out: Dict[str, Any] = {}
    fio = shutil.which("fio")
    try:
        if fio:
            for rw in ("write", "read"):
                if rw == "read":
                    out["read_cold"] = drop_caches()
                r = subprocess.run(
                    [fio, "--name=seq", f"--filename={path}", f"--rw={rw}", "--bs=1M", f"--size={size}",
                     "--ioengine=psync", "--end_fsync=1", "--output-format=json"],
                    capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
                job = json.loads(r.stdout)["jobs"][0][rw]
                out[f"{rw}_gbps"] = job["io_bytes"] / (job["runtime"] / 1e3) / 1e9 if job["runtime"] else None
            out["tool"] = "fio " + subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()
        else:
            block = os.urandom(1 << 20) * 64
            t = now()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                done = 0
                while done < size:
                    done += os.write(fd, block[: min(len(block), size - done)])
                os.fsync(fd)
            finally:
                os.close(fd)
            out["write_gbps"] = size / (now() - t) / 1e9
            out["read_cold"] = drop_caches()
            t = now()
            with open(path, "rb", buffering=0) as f:
                while f.read(64 << 20):
                    pass
            out["read_gbps"] = size / (now() - t) / 1e9
            out["tool"] = "python os.write/os.read (fio is not installed)"
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return out


class Bench:
    def __init__(self, torch: Any, gib: float, work: str) -> None:
        self.torch = torch
        self.work = work
        self.dev = torch.device("cuda", 0)
        self.figures: Dict[str, Any] = {}
        self.checks: List[Dict[str, Any]] = []  # {"name", "ok", "detail"}
        n = 16
        cols = 4096
        rows = max(1, int(gib * GIB / 4 / cols / n))
        g = torch.Generator(device=self.dev).manual_seed(0)
        self.state = {f"layer{i:02d}.w": torch.randn(rows, cols, device=self.dev, generator=g) for i in range(n)}
        self.nbytes = sum(t.numel() * t.element_size() for t in self.state.values())
        torch.cuda.synchronize()

    # -- helpers ------------------------------------------------------------------------------------------------------

    def path(self, name: str) -> str:
        p = os.path.join(self.work, name)
        shutil.rmtree(p, ignore_errors=True)
        return p

    def check(self, name: str, fn: Callable[[], Optional[str]]) -> None:
        """Runs ``fn`` (None: passed; a string: what failed) and records the outcome; an exception is a failure."""
        try:
            why = fn()
        except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
            why = f"{type(e).__name__}: {e}"
        self.checks.append({"name": name, "ok": why is None, "detail": why or ""})
        print(f"{'ok  ' if why is None else 'FAIL'} {name}{': ' + why if why else ''}", flush=True)

    def same_as_state(self, loaded: Dict[str, Any]) -> Optional[str]:
        for k, v in self.state.items():
            got = loaded[k]
            if not self.torch.equal(got.to(self.dev), v):
                return f"{k}: the loaded values differ from the saved ones"
        return None

    def timed(self, fn: Callable[[], Any]) -> float:
        self.torch.cuda.synchronize()
        t = now()
        fn()
        self.torch.cuda.synchronize()
        return now() - t

    # -- the limits ---------------------------------------------------------------------------------------------------

    def limits(self) -> None:
        torch = self.torch
        pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in self.state.items()}
        copies = {k: torch.empty_like(v) for k, v in self.state.items()}

        def d2h() -> None:
            for k, v in self.state.items():
                pinned[k].copy_(v, non_blocking=True)

        def d2d() -> None:
            for k, v in self.state.items():
                copies[k].copy_(v, non_blocking=True)

        d2h()
        d2d()
        self.figures["memcpy_d2h_s"] = min(self.timed(d2h) for _ in range(3))
        self.figures["memcpy_d2d_s"] = min(self.timed(d2d) for _ in range(3))
        del pinned, copies
        torch.cuda.empty_cache()

    # -- distckpt -----------------------------------------------------------------------------------------------------

    def distckpt_runs(self, distckpt: Any) -> None:
        torch = self.torch

        def async_stall(snapshot: bool, label: str) -> None:
            stalls = []
            for i in range(4):  # the first pays for the pinned buffer / snapshot memory; the best of the rest is steady
                p = self.path(f"dc_async_{label}_{i}")
                torch.cuda.synchronize()
                t = now()
                h = distckpt.async_save(self.state, p, device_snapshot=snapshot)
                stalls.append(now() - t)
                # Training goes on: overwrite every tensor right away; the checkpoint must hold the old values.
                for v in self.state.values():
                    v.neg_()
                h.result(timeout=600)
                for v in self.state.values():
                    v.neg_()
                torch.cuda.synchronize()
                if i == 3:
                    out = distckpt.load({k: torch.empty_like(v) for k, v in self.state.items()}, p)
                    why = self.same_as_state(out)
                    if why:
                        raise AssertionError(why)
                shutil.rmtree(p, ignore_errors=True)
            self.figures[f"distckpt_async_{label}_stall_first_s"] = stalls[0]
            self.figures[f"distckpt_async_{label}_stall_s"] = min(stalls[1:])
            self.figures[f"distckpt_async_{label}_stalls_s"] = stalls

        self.check("distckpt async_save (pinned staging): stall measured, saved values are the pre-call ones",
                   lambda: async_stall(False, "pinned"))
        self.check("distckpt async_save(device_snapshot=True): stall measured, saved values are the pre-call ones",
                   lambda: async_stall(True, "snapshot"))

        saved = self.path("dc_save")

        def save() -> None:
            drop_caches()
            self.figures["distckpt_save_s"] = self.timed(lambda: distckpt.save(self.state, saved))

        self.check("distckpt save of the device state", save)

        def resharded_load() -> Optional[str]:
            halves = {}
            for k, v in self.state.items():
                rows, cols = v.shape
                halves[k] = [torch.empty(rows, cols // 2, dtype=v.dtype, device=self.dev) for _ in range(2)]
            target = {
                k: [distckpt.Shard(h, tuple(self.state[k].shape), (0, j * (self.state[k].shape[1] // 2)))
                    for j, h in enumerate(hs)]  # fmt: skip
                for k, hs in halves.items()
            }
            self.figures["load_cold"] = drop_caches()
            self.figures["distckpt_load_resharded_s"] = self.timed(lambda: distckpt.load(target, saved))
            for k, hs in halves.items():
                if not torch.equal(torch.cat(hs, dim=1), self.state[k]):
                    return f"{k}: the resharded load differs from the saved values"
            return None

        self.check("distckpt resharded load (column halves) into device memory, values checked", resharded_load)
        shutil.rmtree(saved, ignore_errors=True)

    # -- DCP ----------------------------------------------------------------------------------------------------------

    def dcp_runs(self) -> None:
        torch = self.torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        if not dist.is_initialized():
            store = dist.FileStore(os.path.join(self.work, "pg_store"), 1)
            dist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=0, world_size=1)
        saved = self.path("dcp_save")

        def save() -> None:
            drop_caches()
            self.figures["dcp_save_s"] = self.timed(lambda: dcp.save(dict(self.state), checkpoint_id=saved))

        self.check("DCP save of the device state", save)

        def load() -> Optional[str]:
            target = {k: torch.empty_like(v) for k, v in self.state.items()}
            drop_caches()
            self.figures["dcp_load_s"] = self.timed(lambda: dcp.load(target, checkpoint_id=saved))
            return self.same_as_state(target)

        self.check("DCP load into device memory, values checked", load)
        shutil.rmtree(saved, ignore_errors=True)

        def async_save() -> None:
            stalls = []
            for i in range(4):
                p = self.path(f"dcp_async_{i}")
                torch.cuda.synchronize()
                t = now()
                fut = dcp.async_save(dict(self.state), checkpoint_id=p)
                stalls.append(now() - t)
                fut.result()
                shutil.rmtree(p, ignore_errors=True)
            self.figures["dcp_async_stall_first_s"] = stalls[0]
            self.figures["dcp_async_stall_s"] = min(stalls[1:])
            self.figures["dcp_async_stalls_s"] = stalls

        self.check("DCP async_save of the device state", async_save)
        dist.destroy_process_group()

    # -- report -------------------------------------------------------------------------------------------------------

    def targets(self) -> List[Dict[str, Any]]:
        f = self.figures
        out = []

        def target(name: str, value: Optional[float], op: str, bound: float, how: str) -> None:
            met = None if value is None else (value >= bound if op == ">=" else value <= bound)
            out.append({"target": name, "value": value, "op": op, "bound": bound, "met": met, "how": how})

        def ratio(a: str, b: str) -> Optional[float]:
            return f[a] / f[b] if f.get(a) and f.get(b) else None

        target("D2H staging throughput vs pinned cudaMemcpy", ratio("memcpy_d2h_s", "distckpt_async_pinned_stall_s"),
               ">=", 0.8, "memcpy time / async_save stall (steady state)")
        target("async-save stall with device_snapshot vs device-to-device copy",
               ratio("distckpt_async_snapshot_stall_s", "memcpy_d2d_s"), "<=", 1.2,
               "stall / D2D copy time (steady state)")
        fio = f.get("fio", {})
        save_gbps = self.nbytes / f["distckpt_save_s"] / 1e9 if f.get("distckpt_save_s") else None
        load_gbps = self.nbytes / f["distckpt_load_resharded_s"] / 1e9 if f.get("distckpt_load_resharded_s") else None
        target("save of device state vs sequential write of the disk",
               save_gbps / fio["write_gbps"] if save_gbps and fio.get("write_gbps") else None, ">=", 0.8,
               "GB/s / fio write GB/s")
        target("resharded load into device memory vs sequential read of the disk",
               load_gbps / fio["read_gbps"] if load_gbps and fio.get("read_gbps") else None, ">=", 0.8,
               "GB/s / fio read GB/s")
        target("save vs DCP save (time)", ratio("distckpt_save_s", "dcp_save_s"), "<=", 1.0, "distckpt / DCP")
        target("async-save stall vs DCP async_save stall", ratio("distckpt_async_pinned_stall_s", "dcp_async_stall_s"),
               "<=", 1.0, "distckpt / DCP")
        target("resharded load vs DCP load (same sharding for DCP)", ratio("distckpt_load_resharded_s", "dcp_load_s"),
               "<=", 1.0, "distckpt / DCP")
        return out

    def report(self, out_dir: str, device: str, elapsed: float) -> Dict[str, Any]:
        f = self.figures
        gb = self.nbytes / 1e9
        rows = []
        for key, label in [
            ("memcpy_d2h_s", "pinned cudaMemcpy D2H (limit)"),
            ("memcpy_d2d_s", "device-to-device copy (limit)"),
            ("distckpt_async_pinned_stall_first_s", "distckpt async_save stall, first (pinned pool allocated)"),
            ("distckpt_async_pinned_stall_s", "distckpt async_save stall (pinned staging), best of 3 more"),
            ("distckpt_async_snapshot_stall_first_s", "distckpt async_save(device_snapshot) stall, first"),
            ("distckpt_async_snapshot_stall_s", "distckpt async_save(device_snapshot) stall, best of 3 more"),
            ("distckpt_save_s", "distckpt save"),
            ("distckpt_load_resharded_s", "distckpt resharded load into device memory"),
            ("dcp_save_s", "DCP save"),
            ("dcp_async_stall_first_s", "DCP async_save stall, first"),
            ("dcp_async_stall_s", "DCP async_save stall, best of 3 more"),
            ("dcp_load_s", "DCP load into device memory"),
        ]:
            if f.get(key):
                rows.append((label, f[key], gb / f[key]))
        targets = self.targets()
        record = {
            "device": device,
            "state_bytes": self.nbytes,
            "figures": f,
            "targets": targets,
            "checks": self.checks,
            "elapsed_s": elapsed,
        }
        with open(os.path.join(out_dir, "gpu_bench.json"), "w") as fp:
            json.dump(record, fp, indent=2, default=str)
        lines = [f"### GPU benchmark: {device}, {self.nbytes / GIB:.2f} GiB of CUDA tensors ({len(self.state)} fp32)",
                 "", "| operation | seconds | GB/s |", "|---|---|---|"]
        lines += [f"| {label} | {s:.4f} | {g:.2f} |" for label, s, g in rows]
        fio = f.get("fio", {})
        if fio:
            lines.append(f"| disk: {fio.get('tool')} write | | {fio.get('write_gbps') or 0:.2f} |")
            cold = "cold" if fio.get("read_cold") else "page cache not dropped"
            lines.append(f"| disk: {fio.get('tool')} read ({cold}) | | {fio.get('read_gbps') or 0:.2f} |")
        lines += ["", "| target | measured | bound | met |", "|---|---|---|---|"]
        for t in targets:
            v = "n/a" if t["value"] is None else f"{t['value']:.2f}x"
            met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
            lines.append(f"| {t['target']} ({t['how']}) | {v} | {t['op']} {t['bound']} | {met} |")
        with open(os.path.join(out_dir, "gpu_bench.md"), "w") as fp:
            fp.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
        return record


def skipped(out_dir: str, why: str) -> int:
    print(f"SKIPPED: {why}", flush=True)
    with open(os.path.join(out_dir, "gpu_bench.json"), "w") as fp:
        json.dump({"skipped": why}, fp)
    with open(os.path.join(out_dir, "gpu_bench.md"), "w") as fp:
        fp.write(f"### GPU benchmark\n\nskipped: {why}\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for gpu_bench.json and gpu_bench.md")
    ap.add_argument("--gib", type=float, default=4.0, help="size of the CUDA state (default 4 GiB)")
    ap.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary directory)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    try:
        import torch
    except ImportError:
        return skipped(args.out, "torch is not installed")
    if not torch.cuda.is_available():
        return skipped(args.out, "torch.cuda.is_available() is False: no GPU here")
    import distckpt

    t0 = now()
    work = tempfile.mkdtemp(prefix="distckpt-gpu-bench-", dir=args.dir)
    try:
        bench = Bench(torch, args.gib, work)
        device = torch.cuda.get_device_name(0)
        print(f"gpu_bench: {device}, {bench.nbytes / GIB:.2f} GiB in {len(bench.state)} tensors, in {work}", flush=True)
        bench.check("limits: pinned D2H and D2D copies", bench.limits)
        bench.check("disk: sequential write and read", lambda: bench.figures.__setitem__(
            "fio", fio_figures(work, min(bench.nbytes, 4 * GIB))))
        bench.distckpt_runs(distckpt)
        bench.dcp_runs()
        bench.report(args.out, device, now() - t0)
        return 0 if all(c["ok"] for c in bench.checks) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
