"""Storage you plug in: the in-process store, fsspec's memory:// filesystem, and Python callback storage (errors
raised in callbacks, thread safety). S3 through a real (moto) server is in test_s3.py."""

from __future__ import annotations

import gc
import os
import threading
import uuid
import weakref

import numpy as np
import pytest

import distckpt
from distckpt.storage import FsspecStorage

fsspec = pytest.importorskip("fsspec")


@pytest.fixture
def mem_url():
    """A fresh memory:// prefix (fsspec's memory filesystem is process-wide)."""
    root = f"memory://distckpt-test-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def state(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "model": {"w": rng.standard_normal((64, 33)).astype(np.float32), "b": np.arange(7, dtype=np.int64)},
        "step": 12,
        "note": "hello",
    }


def check(out, ex):
    np.testing.assert_array_equal(out["model"]["w"], ex["model"]["w"])
    np.testing.assert_array_equal(out["model"]["b"], ex["model"]["b"])
    assert out["step"] == ex["step"] and out["note"] == ex["note"]


def test_memory_url_round_trip(mem_url):
    url = f"{mem_url}/ckpt"
    ex = state()
    summary = distckpt.save(ex, url)
    assert summary.path == url
    fs = fsspec.filesystem("memory")
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(url, detail=False))
    assert "metadata.dckpt" in names and any(n.startswith("data-") for n in names)
    assert not any(n.startswith("STAGING") for n in names), names  # the marker goes once committed
    check(distckpt.load(None, url), ex)

    target = {"model": {"w": np.zeros((64, 33), np.float32), "b": np.zeros(7, np.int64)}, "step": None, "note": None}
    distckpt.load(target, url)
    check(target, ex)
    with distckpt.open(url) as r:
        r.verify()
        np.testing.assert_array_equal(r["model.w"][10:20, 5], ex["model"]["w"][10:20, 5])
        assert r.metadata.user["step"] == "12"
    info = distckpt.storage_stat(url)
    assert info.kind == "checkpoint" and info.leftover_files == 0 and info.files == len(names)


def test_memory_url_async_save_overwrite_and_prune(mem_url):
    url = f"{mem_url}/ckpt"
    first, second = state(1), state(2)
    distckpt.save(first, url)
    with pytest.raises(distckpt.AlreadyExistsError):
        distckpt.save(second, url)
    handle = distckpt.async_save(second, url, overwrite=True)
    second_copy = {"model": {k: v.copy() for k, v in second["model"].items()}, "step": 12, "note": "hello"}
    second["model"]["w"][...] = -1  # the state was copied before async_save returned
    handle.result(timeout=60)
    check(distckpt.load(None, url), second_copy)
    info = distckpt.storage_stat(url)
    assert info.kind == "checkpoint" and info.leftover_files == 0, info  # the superseded files are gone
    assert distckpt.remove_leftovers(url, grace_seconds=0) == []
    distckpt.remove_checkpoint(url)
    assert distckpt.storage_stat(url).kind == "none"
    with pytest.raises(distckpt.NotFoundError):
        distckpt.open(url)
    with pytest.raises(distckpt.NotFoundError):
        distckpt.remove_checkpoint(url)


def test_remove_checkpoint_removes_its_directory_and_nothing_else(tmp_path):
    # Issue 27: the empty checkpoint directory was left behind on POSIX.
    distckpt.save(state(4), tmp_path / "gone")
    distckpt.remove_checkpoint(tmp_path / "gone")
    assert not (tmp_path / "gone").exists()
    # A file distckpt did not write keeps the directory (and itself).
    distckpt.save(state(5), tmp_path / "kept")
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    distckpt.remove_checkpoint(tmp_path / "kept")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["notes.txt"]
    # A symbolic link to a checkpoint: the checkpoint's files go, the link and the directory it names stay.
    distckpt.save(state(6), tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    distckpt.remove_checkpoint(tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real").is_dir()


def test_explicit_storage_objects(tmp_path):
    ex = state(3)
    mem = distckpt.MemoryStorage()
    distckpt.save(ex, "/a/ckpt", storage=mem)
    check(distckpt.load(None, "/a/ckpt", storage=mem), ex)
    with pytest.raises(distckpt.NotFoundError):  # the in-process store is not the file system
        distckpt.open("/a/ckpt")
    posix = distckpt.PosixStorage()
    distckpt.save(ex, tmp_path / "p", storage=posix)
    check(distckpt.load(None, f"file://{tmp_path}/p"), ex)  # file:// URLs stay on POSIX
    assert os.path.isfile(tmp_path / "p" / "metadata.dckpt")
    with pytest.raises(distckpt.InvalidArgumentError):
        distckpt.save(ex, "/x", storage="memory")  # type: ignore[arg-type]


def test_fsspec_storage_passed_explicitly_accepts_urls_and_paths(mem_url):
    fs = fsspec.filesystem("memory")
    st = FsspecStorage(fs, max_in_flight=4)
    ex = state(4)
    distckpt.save(ex, f"{mem_url}/a", storage=st)
    check(distckpt.load(None, fs._strip_protocol(f"{mem_url}/a"), storage=st), ex)
    assert isinstance(distckpt.storage_for(f"{mem_url}/a"), FsspecStorage)
    assert isinstance(distckpt.storage_for("/tmp/x"), distckpt.PosixStorage)
    assert isinstance(distckpt.storage_for("file:///tmp/x"), distckpt.PosixStorage)


def test_export_safetensors_from_and_to_memory_urls(mem_url, tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    ex = state(5)
    distckpt.save(ex, f"{mem_url}/ckpt")
    written = distckpt.export_safetensors(f"{mem_url}/ckpt", f"{mem_url}/hf")
    assert written[-1].endswith("model.safetensors.index.json") and written[0].startswith(mem_url)
    fs = fsspec.filesystem("memory")
    local = tmp_path / "model.safetensors"
    local.write_bytes(fs.cat_file(written[0]))
    tensors = safetensors_numpy.load_file(str(local))
    np.testing.assert_array_equal(tensors["model.w"], ex["model"]["w"])
    # From memory:// to a local directory.
    paths = distckpt.export_safetensors(f"{mem_url}/ckpt", tmp_path / "out")
    assert all(os.path.isfile(p) for p in paths)


class DictFiles:
    """A minimal callback storage: files in a dict, with hooks to make calls fail. Counts concurrent writes."""

    def __init__(self):
        self.files = {}
        self.lock = threading.Lock()
        self.fail_write = None  # an exception to raise from write
        self.fail_size = None
        self.active = 0
        self.most_active = 0

    def create(self, path, size_hint):
        return [path, bytearray(size_hint)]

    def write(self, f, offset, data):
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            if self.fail_write is not None:
                raise self.fail_write
            buf = f[1]
            with self.lock:
                if offset + len(data) > len(buf):
                    buf.extend(bytes(offset + len(data) - len(buf)))
            buf[offset : offset + len(data)] = data
        finally:
            with self.lock:
                self.active -= 1

    def close(self, f, size, discard):
        if not discard:
            with self.lock:
                self.files[f[0]] = bytes(f[1][:size]).ljust(size, b"\0")

    def size(self, path):
        if self.fail_size is not None:
            raise self.fail_size
        with self.lock:
            if path not in self.files:
                raise FileNotFoundError(path)
            return len(self.files[path])

    def read(self, path, offset, out):
        with self.lock:
            if path not in self.files:
                raise FileNotFoundError(path)
            data = self.files[path][offset : offset + len(out)]
        out[: len(data)] = data
        return len(data)

    def list(self, dir):  # noqa: A002
        prefix = dir.rstrip("/") + "/"
        with self.lock:
            return {p[len(prefix) :].split("/", 1)[0] for p in self.files if p.startswith(prefix)}

    def remove(self, path):
        with self.lock:
            self.files.pop(path, None)


def test_callback_storage_round_trip_without_commit_callback():
    files = DictFiles()
    st = distckpt.CallbackStorage(files, max_in_flight=3)
    big = {"w": np.arange(3 << 20, dtype=np.float32)}  # 12 MiB: many writes
    distckpt.save(big, "ck", storage=st, checksum_block_size=1 << 16)
    assert "ck/metadata.dckpt" in files.files
    assert 1 <= files.most_active <= 3
    np.testing.assert_array_equal(distckpt.load(None, "ck", storage=st)["w"], big["w"])
    assert distckpt.storage_stat("ck", storage=st).kind == "checkpoint"


def test_callback_threads_keep_their_thread_local_state_between_calls():
    # A callback on one of distckpt's threads runs on a Python thread state that lives as long as the thread: what the
    # storage keeps in threading.local() (a per-thread buffer, a client) is still there at its next call, and it is
    # released with the thread (the state is deleted when the engine's pool joins its threads).
    class Scratch:
        pass

    class PerThread(DictFiles):
        def __init__(self):
            super().__init__()
            self.local = threading.local()
            self.made = []  # weak references to the per-thread objects created
            self.calls = 0
            self.threads = set()

        def write(self, f, offset, data):
            if getattr(self.local, "scratch", None) is None:
                self.local.scratch = Scratch()
                with self.lock:
                    self.made.append(weakref.ref(self.local.scratch))
            with self.lock:
                self.calls += 1
                self.threads.add(threading.get_ident())
            super().write(f, offset, data)

    files = PerThread()
    st = distckpt.CallbackStorage(files, max_in_flight=4)
    big = {f"w{i}": np.full(1 << 20, i, dtype=np.float32) for i in range(8)}  # 32 MiB: several writes per thread
    threads = 0  # (save, engine thread) pairs: a thread's id may come back in a later save
    main_wrote = False  # the calling thread writes too; it is the same thread in every save
    for i in range(3):
        files.threads.clear()
        distckpt.save(big, f"ck{i}", storage=st, io_threads=2)
        main_wrote |= threading.get_ident() in files.threads
        threads += len(files.threads - {threading.get_ident()})
    threads += main_wrote
    assert files.calls > 2 * threads
    assert len(files.made) == threads, (len(files.made), threads, files.calls)
    gc.collect()
    me = getattr(files.local, "scratch", None)  # the calling thread may have written too; it is still alive
    assert all(ref() is None or ref() is me for ref in files.made)  # the engine's threads went, and their states
    np.testing.assert_array_equal(distckpt.load(None, "ck2", storage=st)["w7"], big["w7"])


def test_callback_exceptions_become_errors_with_their_text():
    files = DictFiles()
    st = distckpt.CallbackStorage(files)
    files.fail_write = RuntimeError("the disk is on fire")
    with pytest.raises(distckpt.StorageError) as info:
        distckpt.save({"w": np.ones(1000)}, "ck", storage=st)
    assert "the disk is on fire" in str(info.value) and "RuntimeError" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not any(p.endswith("metadata.dckpt") for p in files.files)

    files.fail_write = None
    distckpt.save({"w": np.ones(1000)}, "ck", storage=st)
    files.fail_size = PermissionError("access denied by policy")
    with pytest.raises(distckpt.Error) as info:
        distckpt.open("ck", storage=st)
    assert "access denied by policy" in str(info.value)
    files.fail_size = None
    with pytest.raises(distckpt.NotFoundError) as info:  # FileNotFoundError -> DCKPT_ENOTFOUND
        distckpt.open("elsewhere", storage=st)
    assert "raised" not in str(info.value)  # a missing path is an answer, not a callback failure


class PartedFiles(DictFiles):
    """DictFiles with multipart uploads: parts kept per upload, the file made of them on complete; every part sent is
    logged as (number, size), and part ``fail_part`` fails."""

    min_part_size = 1 << 20

    def __init__(self):
        super().__init__()
        self.sent = []
        self.aborted = 0
        self.fail_part = 0

    def upload_begin(self, path, size_hint):
        return [path, {}]

    def upload_part(self, up, number, data):
        with self.lock:
            self.sent.append((number, len(data)))
        if number == self.fail_part:
            raise ConnectionResetError("connection reset by the store")
        up[1][number] = bytes(data)

    def upload_complete(self, up):
        parts = up[1]
        assert sorted(parts) == list(range(1, len(parts) + 1))
        with self.lock:
            self.files[up[0]] = b"".join(parts[n] for n in sorted(parts))

    def upload_abort(self, up):
        with self.lock:
            self.aborted += 1


def test_multipart_uploads_are_assembled_by_the_core():
    files = PartedFiles()
    st = distckpt.CallbackStorage(files, max_in_flight=4)
    big = {"w": np.arange((4 << 20) // 4 + 1000, dtype=np.float32)}  # 4 MiB and a little: 5 parts of 1 MiB
    distckpt.save(big, "mp", storage=st)
    (data,) = [p for p in files.files if "/data-" in p]
    size, part = len(files.files[data]), files.min_part_size
    n = -(-size // part)
    assert sorted(files.sent) == [(i, part) for i in range(1, n)] + [(n, size - (n - 1) * part)]
    assert "mp/metadata.dckpt" in files.files and files.aborted == 0
    np.testing.assert_array_equal(distckpt.load(None, "mp", storage=st)["w"], big["w"])

    files.fail_part = 2  # a failed part fails the save, aborts its upload, and no data file appears
    with pytest.raises(distckpt.Error, match="connection reset by the store"):
        distckpt.save(big, "failed", storage=st)
    assert files.aborted == 1
    assert not [p for p in files.files if p.startswith("failed/") and "/data-" in p]


def test_upload_methods_go_together():
    class Half(DictFiles):
        def upload_begin(self, path, size_hint):
            return None

    with pytest.raises(TypeError, match="upload_part"):
        distckpt.CallbackStorage(Half())


def test_a_storage_needs_the_required_methods():
    class NoRead:
        def create(self, path, size_hint):
            return None

    with pytest.raises(TypeError, match="write"):
        distckpt.CallbackStorage(NoRead())


def test_a_reader_keeps_its_storage_alive(mem_url):
    url = f"{mem_url}/ckpt"
    ex = state(6)
    distckpt.save(ex, url)
    r = distckpt.open(url)  # the only reference to the FsspecStorage made for the URL is the reader's
    import gc

    gc.collect()
    np.testing.assert_array_equal(r["model.w"][...], ex["model"]["w"])
    r.close()


@pytest.mark.parametrize("block", [0, 4096, 12288, 1 << 20])
def test_fsspec_reads_through_blocks_of_any_size(mem_url, block):
    fs = fsspec.filesystem("memory")
    st = FsspecStorage(fs, read_block_size=block)
    ex = {"w": np.arange(300_001, dtype=np.float32), "v": np.arange(17, dtype=np.int8)}
    distckpt.save(ex, f"{mem_url}/b", storage=st)
    out = distckpt.load(None, f"{mem_url}/b", storage=st)
    np.testing.assert_array_equal(out["w"], ex["w"])
    np.testing.assert_array_equal(out["v"], ex["v"])
    with distckpt.open(f"{mem_url}/b", storage=st) as r:
        np.testing.assert_array_equal(r["w"][123_456:200_000], ex["w"][123_456:200_000])
        r.verify()
    assert len(st.impl._blocks) == 0 or block == 0 or len(st.impl._blocks) <= st.impl._MAX_BLOCKS


def test_leftovers_beside_checkpoints_are_judged_and_pruned_by_the_core(tmp_path):
    """A staging directory of a live writer (this process) stays whatever its age; one whose writer exited, a
    directory an overwrite moved aside and one a prune moved aside go once idle; a link named like a leftover is never
    followed or removed; storage_stat / remove_leftovers on the checkpoint path see the same (issue 27)."""
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)

    def staging(name: str, pid: int) -> str:
        d = tmp_path / name
        d.mkdir()
        (d / "STAGING").write_text(f"host: {socket.gethostname()}\npid: {pid}\nstarted_utc: 2026-01-01T00:00:00Z\n")
        (d / "data-00000.bin").write_bytes(b"x" * 100)
        return str(d)

    live = staging("ckpt.dckpt-staging-0000000000000001", os.getpid())
    exited = staging("ckpt.dckpt-staging-0000000000000002", dead_pid)
    old = tmp_path / "ckpt.dckpt-old-0000000000000003"
    old.mkdir()
    deleting = tmp_path / "other.dckpt-deleting-0000000000000004"
    deleting.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    os.symlink(outside, tmp_path / "x.dckpt-old-0000000000000005")

    within = distckpt.scan_leftovers(tmp_path, grace_seconds=3600)
    assert [x.name for x in within] == sorted(
        [os.path.basename(live), os.path.basename(exited), old.name, deleting.name]
    )
    assert not any(x.garbage for x in within), [x.reason for x in within]
    by_name = {x.name: x for x in distckpt.scan_leftovers(tmp_path, grace_seconds=0)}
    assert by_name[os.path.basename(live)].writer == "running" and not by_name[os.path.basename(live)].garbage
    assert by_name[os.path.basename(exited)].writer == "exited" and by_name[os.path.basename(exited)].garbage
    assert "has exited" in by_name[os.path.basename(exited)].reason
    assert by_name[os.path.basename(exited)].bytes > 100
    assert by_name[old.name].kind == "replaced" and by_name[deleting.name].kind == "deleting"
    info = distckpt.storage_stat(tmp_path / "ckpt", grace_seconds=0)
    assert info.kind == "incomplete" and info.saves_in_progress == 1 and info.leftover_files == 2, info

    assert {x.name for x in distckpt.prune(tmp_path, grace_seconds=0, dry_run=True)} == {
        os.path.basename(exited),
        old.name,
        deleting.name,
    }
    assert os.path.isdir(exited)
    pruned = distckpt.prune(tmp_path, grace_seconds=0)
    assert {x.name for x in pruned} == {os.path.basename(exited), old.name, deleting.name}
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(live), "outside", "x.dckpt-old-0000000000000005"])
    assert (outside / "precious").read_text() == "keep"
    assert distckpt.prune(tmp_path, grace_seconds=0) == []  # the live writer's directory stays
