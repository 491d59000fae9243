#!/usr/bin/env python3
"""Storage benchmark: distckpt's S3 backend in the core (issue 28) and its plugged-in storage (issue 13).

(a) S3: save and resharded load of N MiB through a moto S3 server on loopback (started here) with the core's S3
    backend (S3Storage, what s3:// URLs get), against plain transfers of the very same objects in the same run: s3fs
    (fs.pipe / fs.cat) and boto3 (upload_fileobj with multipart parts of the same size / one get_object per object),
    and against the fsspec route it replaces (FsspecStorage over s3fs).
    ratio = plain time / distckpt time (1.0: as fast as the raw client; target >= 0.9).
(b) Callback overhead: save and load of the same state to a local directory with the built-in POSIX backend
    (storage=None) and through a Python callback storage writing the same files with os.pwrite / os.preadv on file
    descriptors (the GIL is released in the system calls). overhead = callback time / POSIX time - 1 (target <= 10%).

Usage: .venv/bin/python bench/storage/s3_bench.py [--mib 256] [--repeat 3] [--read-block-size 4,64,256] [--skip-local]
"""

from __future__ import annotations

import argparse
import ctypes
import io
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))  # the tests' moto server helper

import distckpt  # noqa: E402
from distckpt.storage import CallbackStorage, FsspecStorage, S3Storage  # noqa: E402

TENSORS = 4
DIRECT_MIN = 256 << 10  # LocalFiles: writes at least this large go through O_DIRECT
BOUNCE_BYTES = 8 << 20  # LocalFiles: per-thread aligned buffer for them
COLS = 1024  # float32 columns: a row is 4 KiB


def make_state(mib: int, save_parts: int):
    """TENSORS float32 tensors of mib/TENSORS MiB each, every one held as `save_parts` row slabs (as by
    `save_parts` ranks) by this process."""
    rows = (mib << 20) // (TENSORS * COLS * 4)
    rng = np.random.default_rng(0)
    full = [rng.standard_normal((rows, COLS), dtype=np.float32) for _ in range(TENSORS)]
    state = {}
    for t, a in enumerate(full):
        bounds = np.linspace(0, rows, save_parts + 1).astype(int)
        state[f"t{t}"] = [distckpt.Shard(a[lo:hi], a.shape, (lo, 0)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return full, state


def load_target(full, load_parts: int):
    """The same tensors as `load_parts` row slabs with other boundaries (a resharded load)."""
    target, outs = {}, []
    for t, a in enumerate(full):
        bounds = np.linspace(0, a.shape[0], load_parts + 1).astype(int)
        pieces = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            buf = np.empty((hi - lo, COLS), np.float32)
            pieces.append(distckpt.Shard(buf, a.shape, (lo, 0)))
            outs.append((t, lo, hi, buf))
        target[f"t{t}"] = pieces
    return target, outs


def check(full, outs):
    for t, lo, hi, buf in outs:
        if not np.array_equal(buf, full[t][lo:hi]):
            raise AssertionError(f"tensor t{t} rows {lo}:{hi} differ after the load")


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ---- (a) S3 ---------------------------------------------------------------------------------------------------------


def bench_s3(mib: int, repeat: int, max_concurrency: int, in_flight: int, block_sizes, part_size: int,
             fsspec_block: int):  # fmt: skip
    """Per repeat, a dict of seconds: save/load of the core backend (one load per read block size), of the fsspec
    route, and the plain s3fs and boto3 uploads and downloads of the core save's data objects; plus bytes, objects."""
    import _s3_server
    from boto3.s3.transfer import TransferConfig

    server = _s3_server.MotoServer()
    try:
        os.environ.update(server.env())
        fs = server.s3fs(max_concurrency=max_concurrency)
        s3 = server.client()
        transfer = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                                  max_concurrency=max_concurrency)  # fmt: skip
        bucket = "bench"
        s3.create_bucket(Bucket=bucket)
        core = [S3Storage(server.endpoint, max_in_flight=in_flight, part_size=part_size, read_block_size=bs)
                for bs in block_sizes]  # fmt: skip
        via_fsspec = FsspecStorage(fs, max_in_flight=in_flight, read_block_size=fsspec_block,
                                   upload_part_size=part_size)  # fmt: skip
        full, state = make_state(mib, save_parts=4)
        rows = []
        for i in range(repeat):
            t = {}
            url = f"s3://{bucket}/core-{i}"
            t["save core"] = timed(lambda: distckpt.save(state, url, storage=core[0]))
            for bs, storage in zip(block_sizes, core):
                target, outs = load_target(full, load_parts=3)
                t[f"load core {bs}"] = timed(lambda: distckpt.load(target, url, storage=storage))
                check(full, outs)
            # The largest blocks again without checksum verification: what verifying costs.
            target, outs = load_target(full, load_parts=3)
            t["load core noverify"] = timed(lambda: distckpt.load(target, url, storage=core[-1], verify=False))
            check(full, outs)
            fs_url = f"s3://{bucket}/fsspec-{i}"
            t["save fsspec"] = timed(lambda: distckpt.save(state, fs_url, storage=via_fsspec))
            target, outs = load_target(full, load_parts=3)
            t["load fsspec"] = timed(lambda: distckpt.load(target, fs_url, storage=via_fsspec))
            check(full, outs)
            # The core save's data objects through s3fs alone, then boto3 alone: all uploaded at once, then all
            # downloaded at once.
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"core-{i}/")["Contents"]
                    if "/data-" in o["Key"]]  # fmt: skip
            blobs = {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}
            plain = {f"{bucket}/plain-{i}/{k.rsplit('/', 1)[-1]}": v for k, v in blobs.items()}
            t["upload s3fs"] = timed(lambda: fs.pipe(plain))
            got = {}
            t["download s3fs"] = timed(lambda: got.update(fs.cat(list(plain))))
            assert all(len(got[k]) == len(v) for k, v in plain.items())
            got.clear()
            boto_keys = {f"boto-{i}/{k.rsplit('/', 1)[-1]}": v for k, v in blobs.items()}
            t["upload boto3"] = timed(lambda: _boto3_each(boto_keys, lambda k, v: s3.upload_fileobj(
                io.BytesIO(v), bucket, k, Config=transfer)))  # fmt: skip
            t["download boto3"] = timed(lambda: _boto3_each(boto_keys, lambda k, v: got.__setitem__(
                k, s3.get_object(Bucket=bucket, Key=k)["Body"].read())))  # fmt: skip
            assert all(len(got[k]) == len(v) for k, v in boto_keys.items())
            nbytes = sum(len(v) for v in blobs.values())
            for d in (got, plain, blobs, boto_keys):
                d.clear()
            rows.append((t, nbytes, len(keys)))
            fs.rm(f"{bucket}/plain-{i}", recursive=True)
            fs.rm(f"{bucket}/boto-{i}", recursive=True)
            distckpt.remove_checkpoint(url, storage=core[0])
            distckpt.remove_checkpoint(fs_url, storage=via_fsspec)
        return rows
    finally:
        server.stop()


def _boto3_each(items, fn):
    """fn(key, value) for every item at once, one thread per object (as s3fs's pipe/cat run them)."""
    threads = [threading.Thread(target=fn, args=kv) for kv in items.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


# ---- (b) callback overhead ------------------------------------------------------------------------------------------


class LocalFiles:
    """The callback protocol over local files: positional writes and reads on file descriptors, a temporary name
    published by rename on close, fsync where distckpt asks for durability."""

    def __init__(self):
        self._fds = {}  # path -> read fd, opened once
        self._lock = threading.Lock()
        self._local = threading.local()

    def create(self, path, size_hint):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        direct = -1
        try:
            if size_hint:
                os.posix_fallocate(fd, 0, size_hint)  # extents allocated once, not by every concurrent write
            if hasattr(os, "O_DIRECT"):
                direct = os.open(tmp, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
        except OSError:
            pass  # no preallocation or no O_DIRECT here (tmpfs): buffered writes only
        return [fd, direct, path, tmp]

    def write(self, f, offset, data):
        # As distckpt's POSIX backend does: the page-aligned body of a large write bypasses the page cache (O_DIRECT,
        # through a per-thread aligned bounce buffer, since the caller's buffer need not be aligned), the tail and
        # small writes go through it; durable saves then do not wait for a flood of dirty pages at fsync.
        fd, direct = f[0], f[1]
        body = len(data) - len(data) % 4096
        if direct >= 0 and body >= DIRECT_MIN and offset % 4096 == 0:
            src = np.frombuffer(data, np.uint8).ctypes.data  # the address, to test alignment and to copy from
            if src % 4096 == 0:
                self._pwrite_all(direct, data[:body], offset)
            else:
                bounce, bounce_addr = self._bounce()
                done = 0
                while done < body:
                    n = min(body - done, len(bounce))
                    ctypes.memmove(bounce_addr, src + done, n)  # a ctypes call: the copy runs without the GIL
                    self._pwrite_all(direct, bounce[:n], offset + done)
                    done += n
            data, offset = data[body:], offset + body
        self._pwrite_all(fd, data, offset)

    def _bounce(self):
        held = getattr(self._local, "bounce", None)
        if held is None:
            m = mmap.mmap(-1, BOUNCE_BYTES)  # page-aligned
            addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            held = self._local.bounce = (memoryview(m), addr)
        return held

    @staticmethod
    def _pwrite_all(fd, data, offset):
        while len(data):
            n = os.pwrite(fd, data, offset)
            data, offset = data[n:], offset + n

    def sync(self, f):
        os.fsync(f[0])

    def close(self, f, size, discard):
        fd, direct, path, tmp = f
        try:
            if not discard:
                os.ftruncate(fd, size)
        finally:
            os.close(fd)
            if direct >= 0:
                os.close(direct)
        if discard:
            os.unlink(tmp)
        else:
            os.rename(tmp, path)

    def size(self, path):
        return os.stat(path).st_size

    def _read_fd(self, path):
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            return fd

    def read(self, path, offset, out):
        fd = self._read_fd(path)
        got = 0
        while got < len(out):
            n = os.preadv(fd, [out[got:]], offset + got)
            if n == 0:
                break
            got += n
        return got

    def list(self, dir):  # noqa: A002
        try:
            return os.listdir(dir)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def remove(self, path):
        with self._lock:
            fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def commit(self, path, data, replace):
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.rename(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails with FileExistsError if something is there, atomically
            finally:
                os.unlink(tmp)
        dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def forget(self):
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def bench_local(mib: int, repeat: int, root: str):
    full, state = make_state(mib, save_parts=4)
    rows = []
    for i in range(repeat):
        for kind in ("posix", "callback"):
            files = LocalFiles() if kind == "callback" else None
            storage = CallbackStorage(files) if files else None
            path = os.path.join(root, f"{kind}-{i}")
            t_save = timed(lambda: distckpt.save(state, path, storage=storage))
            target, outs = load_target(full, load_parts=3)
            t_load = timed(lambda: distckpt.load(target, path, storage=storage))
            check(full, outs)
            if files:
                files.forget()
            shutil.rmtree(path)
            rows.append((kind, t_save, t_load))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256, help="state size in MiB (default 256)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="local directory for (b) (default: a temporary one)")
    ap.add_argument("--max-concurrency", type=int, default=8,
                    help="s3fs max_concurrency and boto3's (multipart parts at once)")
    ap.add_argument("--max-in-flight", type=int, default=16, help="S3Storage and FsspecStorage max_in_flight")
    ap.add_argument("--read-block-size", default="4,64,512",
                    help="S3Storage read_block_size in MiB; a comma-separated list loads once with each")
    ap.add_argument("--fsspec-read-block-size", type=int, default=64, help="FsspecStorage read_block_size in MiB")
    ap.add_argument("--part-size", type=int, default=8,
                    help="multipart part size in MiB: S3Storage, FsspecStorage and boto3")
    ap.add_argument("--skip-s3", action="store_true")
    ap.add_argument("--skip-local", action="store_true")
    args = ap.parse_args()
    mib = args.mib
    print(f"distckpt {distckpt.__version__}, state {mib} MiB in {TENSORS} float32 tensors, saved as 4 row slabs, "
          f"loaded as 3 (resharded); median of {args.repeat}")
    if not args.skip_s3:
        blocks = [int(b) for b in args.read_block_size.split(",")]
        rows = bench_s3(mib, args.repeat, args.max_concurrency, args.max_in_flight, [b << 20 for b in blocks],
                        args.part_size << 20, args.fsspec_read_block_size << 20)  # fmt: skip
        med = lambda k: statistics.median(r[0][k] for r in rows)  # noqa: E731
        nbytes, nfiles = rows[0][1], rows[0][2]
        print(f"\n(a) S3 on a loopback moto server: {nbytes / 2**20:.0f} MiB of data in {nfiles} objects "
              f"(parts of {args.part_size} MiB, max_in_flight={args.max_in_flight}, s3fs/boto3 "
              f"max_concurrency={args.max_concurrency})")
        print(f"{'':44}{'s':>8}{'MiB/s':>8}{'s3fs':>7}{'boto3':>7}{'fsspec route':>14}")
        print(f"{'':44}{'':16}{'ratio = plain s / distckpt s':>28}")
        lines = [("save, core S3", med("save core"), "upload", med("save fsspec"))]
        lines += [(f"load, core S3, {b} MiB read blocks", med(f"load core {b << 20}"), "download", med("load fsspec"))
                  for b in blocks]  # fmt: skip
        lines.append((f"load, core S3, {blocks[-1]} MiB blocks, verify=False", med("load core noverify"), "download",
                      None))  # fmt: skip
        lines += [("save, fsspec route", med("save fsspec"), "upload", None),
                  (f"load, fsspec route, {args.fsspec_read_block_size} MiB blocks", med("load fsspec"), "download",
                   None)]  # fmt: skip
        for name, d, plain, route in lines:
            s3fs_r, boto_r = med(f"{plain} s3fs") / d, med(f"{plain} boto3") / d
            route_r = f"{route / d:14.2f}" if route is not None else f"{'':14}"
            print(f"{name:44}{d:8.3f}{nbytes / 2**20 / d:8.1f}{s3fs_r:7.2f}{boto_r:7.2f}{route_r}")
        for label, k in (("upload, s3fs pipe", "upload s3fs"), ("upload, boto3 upload_fileobj", "upload boto3"),
                         ("download, s3fs cat", "download s3fs"), ("download, boto3 get_object", "download boto3")):
            print(f"{label:44}{med(k):8.3f}{nbytes / 2**20 / med(k):8.1f}")  # fmt: skip
    if not args.skip_local:
        root = args.dir or tempfile.mkdtemp(prefix="distckpt-bench-")
        try:
            rows = bench_local(mib, args.repeat, root)
        finally:
            if not args.dir:
                shutil.rmtree(root, ignore_errors=True)
        print(f"\n(b) local directory {args.dir or '(temporary, ' + tempfile.gettempdir() + ')'}: built-in POSIX "
              f"vs Python callback storage (os.pwrite/os.preadv)")
        print(f"{'':12}{'POSIX s':>10}{'callback s':>12}{'POSIX MiB/s':>13}{'overhead':>10}")
        for label, k in (("save", 1), ("load", 2)):
            p = statistics.median(r[k] for r in rows if r[0] == "posix")
            c = statistics.median(r[k] for r in rows if r[0] == "callback")
            print(f"{label:12}{p:10.3f}{c:12.3f}{mib / p:13.1f}{(c / p - 1) * 100:9.1f}%")


if __name__ == "__main__":
    main()
