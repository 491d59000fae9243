"""``FsspecStorage``: distckpt's storage callbacks over any fsspec filesystem (s3fs, gcsfs, adlfs, memory, ...), through
fsspec's public API only: files assembled in memory and uploaded on close (or, where s3fs is the filesystem, streamed
as S3 multipart uploads whose parts distckpt assembles), ranged reads served from blocks, and the metadata committed
with an exclusive write. Internal: ``distckpt.storage.FsspecStorage`` (and ``distckpt.FsspecStorage``) is the public
name. fsspec itself is imported by the caller that makes the filesystem, never here at import time.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any, List, Optional, Tuple

from ._backends import CallbackStorage, PathLike
from .errors import InvalidArgumentError


class _Upload:
    """A file of at most one part being written (larger ones go up as multipart uploads that distckpt assembles): its
    bytes, assembled in memory at the offsets distckpt writes them, published on close with one ``pipe_file``."""

    __slots__ = ("path", "buf", "lock")

    def __init__(self, path: str, size_hint: int) -> None:
        self.path = path
        self.buf: Optional[bytearray] = bytearray(size_hint)
        self.lock = threading.Lock()


class _Multipart:
    """An S3 multipart upload: distckpt sends its parts (numbered, in order, each complete) and completes or aborts
    it."""

    __slots__ = ("bucket", "key", "upload_id", "etags", "lock")

    def __init__(self, bucket: str, key: str, upload_id: str) -> None:
        self.bucket, self.key, self.upload_id = bucket, key, upload_id
        self.etags: "dict[int, str]" = {}
        self.lock = threading.Lock()


class _Block:
    """A block of a data file fetched with one ranged GET, kept until every byte of it has been handed out."""

    __slots__ = ("ready", "data", "error", "served")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.data = b""
        self.error: Optional[BaseException] = None
        self.served = 0


class _FsspecFiles:
    """The callback protocol over an fsspec filesystem, through its public API only (no per-store code)."""

    _MAX_BLOCKS = 64  # blocks kept at most (a reader reading scattered regions never finishes a block)

    def __init__(
        self, fs: Any, atomic_commit: Optional[bool], read_block_size: int = 0, upload_part_size: int = 0
    ) -> None:
        self.fs = fs
        self.read_block_size = read_block_size
        # Streaming multipart uploads need S3's part calls: s3fs (its client call and event loop) only; other stores
        # get one pipe_file per file.
        s3 = callable(getattr(fs, "_call_s3", None)) and callable(getattr(fs, "split_path", None))
        self.upload_part_size = upload_part_size if s3 and getattr(fs, "loop", None) is not None else 0
        # distckpt assembles the parts (upload_*); without them it hands every file to create/write/close.
        self.min_part_size = self.upload_part_size
        if not self.upload_part_size:
            self.upload_begin = self.upload_part = self.upload_complete = self.upload_abort = None  # type: ignore
        self._blocks: "dict[Tuple[str, int], _Block]" = {}
        self._blocks_lock = threading.Lock()
        # pipe_file(mode="create") is fsspec's exclusive write: a conditional PUT on S3 (s3fs), a check then a write
        # elsewhere (AbstractFileSystem), no worse than distckpt's own check. Filesystems too old to take `mode`
        # get no commit callback: distckpt then checks and writes itself.
        if atomic_commit is None:
            try:
                atomic_commit = "mode" in inspect.signature(fs.pipe_file).parameters
            except (TypeError, ValueError):
                atomic_commit = False
        if not atomic_commit:
            self.commit = None  # type: ignore[assignment]

    def _fresh(self, path: str) -> None:
        # Other processes (other ranks) write the same store: never answer from a listing cached earlier.
        try:
            self.fs.invalidate_cache(path)
        except Exception:  # noqa: BLE001 - a filesystem without a cache
            pass

    def create(self, path: str, size_hint: int) -> _Upload:
        return _Upload(path, size_hint)

    def write(self, f: _Upload, offset: int, data: memoryview) -> None:
        end = offset + len(data)
        buf = f.buf
        assert buf is not None, "write after close"
        if end > len(buf):
            with f.lock:
                if end > len(buf):
                    buf.extend(bytes(end - len(buf)))
        buf[offset:end] = data

    sync = None  # close uploads the whole file: once it returns the object is stored

    def close(self, f: _Upload, size: int, discard: bool) -> None:
        buf, f.buf = f.buf, None
        if buf is None or discard:
            return
        if len(buf) < size:
            buf.extend(bytes(size - len(buf)))
        elif len(buf) > size:
            del buf[size:]
        self.fs.pipe_file(f.path, buf)  # bytes-like: s3fs and botocore take the bytearray itself, no copy

    # -- multipart uploads (s3fs): distckpt assembles the parts --

    def _s3(self, method: str, **kwargs: Any) -> Any:
        """One S3 call through s3fs's client, from any thread (it runs on the filesystem's event loop)."""
        import fsspec.asyn  # noqa: PLC0415 - fsspec is optional; only FsspecStorage needs it

        return fsspec.asyn.sync(self.fs.loop, self.fs._call_s3, method, **kwargs)

    def upload_begin(self, path: str, size_hint: int) -> _Multipart:
        bucket, key, _ = self.fs.split_path(path)
        return _Multipart(bucket, key, self._s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"])

    def upload_part(self, up: _Multipart, number: int, data: memoryview) -> None:
        # botocore takes bytes or bytearray, not a view (and the view is distckpt's buffer, valid only now).
        etag = self._s3(
            "upload_part", Bucket=up.bucket, Key=up.key, UploadId=up.upload_id, PartNumber=number, Body=bytes(data)
        )["ETag"]
        with up.lock:
            up.etags[number] = etag

    def upload_complete(self, up: _Multipart) -> None:
        parts = [{"PartNumber": n, "ETag": up.etags[n]} for n in sorted(up.etags)]
        try:
            self._s3(
                "complete_multipart_upload", Bucket=up.bucket, Key=up.key, UploadId=up.upload_id,
                MultipartUpload={"Parts": parts},
            )  # fmt: skip
        except BaseException:
            self.upload_abort(up)  # distckpt calls nothing more on a failed upload: leave no parts behind
            raise
        self.fs.invalidate_cache(f"{up.bucket}/{up.key}")

    def upload_abort(self, up: _Multipart) -> None:
        try:
            self._s3("abort_multipart_upload", Bucket=up.bucket, Key=up.key, UploadId=up.upload_id)
        except Exception:  # noqa: BLE001 - the store cleans up unfinished uploads; the first error is the news
            pass

    def size(self, path: str) -> int:
        self._fresh(path)
        info = self.fs.info(path)
        if info.get("type") == "directory":
            raise FileNotFoundError(path)
        return int(info["size"])

    def read(self, path: str, offset: int, out: memoryview) -> int:
        if len(out) == 0:
            return 0
        bs = self.read_block_size
        # Only data files go through blocks: their names carry a nonce, so their bytes never change under a cached
        # block (the metadata at a fixed name does).
        if not bs or len(out) >= bs or not path.rsplit("/", 1)[-1].startswith("data-"):
            data = self.fs.cat_file(path, start=offset, end=offset + len(out))
            n = len(data)
            out[:n] = data
            return n
        got = 0
        while got < len(out):
            pos = offset + got
            index, start = divmod(pos, bs)
            block = self._block(path, index)
            chunk = block.data[start : start + len(out) - got]
            out[got : got + len(chunk)] = chunk
            got += len(chunk)
            self._served(path, index, block, len(chunk))
            if len(block.data) < bs:  # the file's last block: nothing lies beyond
                break
        return got

    def _block(self, path: str, index: int) -> _Block:
        key = (path, index)
        with self._blocks_lock:
            block = self._blocks.get(key)
            owner = block is None
            if owner:
                block = self._blocks[key] = _Block()
                while len(self._blocks) > self._MAX_BLOCKS:  # the oldest first
                    del self._blocks[next(iter(self._blocks))]
        if owner:
            bs = self.read_block_size
            try:
                block.data = self.fs.cat_file(path, start=index * bs, end=(index + 1) * bs)
            except BaseException as e:
                block.error = e
                with self._blocks_lock:
                    if self._blocks.get(key) is block:
                        del self._blocks[key]
                raise
            finally:
                block.ready.set()
        else:
            block.ready.wait()
            if block.error is not None:
                raise block.error
        return block

    def _served(self, path: str, index: int, block: _Block, n: int) -> None:
        with self._blocks_lock:
            block.served += n
            if block.served >= len(block.data) and self._blocks.get((path, index)) is block:
                del self._blocks[(path, index)]

    def list(self, dir: str) -> List[str]:  # noqa: A002 - the protocol's name
        self._fresh(dir)
        try:
            entries = self.fs.ls(dir, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        prefix = self.fs._strip_protocol(dir).rstrip("/")
        names = set()
        for e in entries:
            e = e.rstrip("/")
            if e == prefix:  # ls of a file lists the file itself
                continue
            names.add(e.rsplit("/", 1)[-1])
        return sorted(n for n in names if n)

    def remove(self, path: str) -> None:
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def commit(self, path: str, data: bytes, replace: bool) -> None:
        self.fs.pipe_file(path, data, mode="overwrite" if replace else "create")


class FsspecStorage(CallbackStorage):
    """Any fsspec filesystem (s3fs, gcsfs, adlfs, memory, ...), through the fsspec API.

    Each file is assembled in memory (preallocated from distckpt's size hint, written at offsets by several threads)
    and uploaded with ``fs.pipe_file`` when distckpt closes it; on S3 through s3fs, a file of more than one part is
    streamed instead: distckpt assembles the parts of a multipart upload itself and sends each as soon as its bytes
    are written, holding a few parts per file, never the whole file. Reads are ranged ``fs.cat_file`` calls; the
    metadata is committed with ``fs.pipe_file(mode="create")`` (a conditional PUT on S3). Memory: a rank holds the
    files it is writing whole on other stores, a few parts of each on S3.

    Args:
        fs: an ``fsspec.AbstractFileSystem``. Tune the store there (e.g. ``s3fs.S3FileSystem(max_concurrency=8)``
            for parallel multipart uploads of large files).
        max_in_flight: the most reads and writes distckpt runs at once (0: its default, 16).
        atomic_commit: use ``pipe_file(mode=...)`` for the commit (None: when the filesystem takes ``mode``).
        read_block_size: smaller reads of data files are served from blocks of this size, each fetched with one
            ranged read and dropped once all of it was handed out (fewer, larger GETs; at most 64 blocks held);
            0: every read is its own ranged read.
        upload_part_size: the part size of streamed uploads on S3 (at least 5 MiB, S3's smallest part; distckpt
            grows it for files that would need more than 10000 parts); 0: no streaming, one ``pipe_file`` per file on
            close.
    """

    def __init__(
        self, fs: Any, *, max_in_flight: int = 32, atomic_commit: Optional[bool] = None,
        read_block_size: int = 16 << 20, upload_part_size: int = 32 << 20,
    ) -> None:  # fmt: skip
        if upload_part_size and upload_part_size < (5 << 20):
            raise InvalidArgumentError(f"upload_part_size must be 0 or at least 5 MiB, not {upload_part_size}")
        self.fs = fs
        files = _FsspecFiles(fs, atomic_commit, read_block_size, upload_part_size)
        super().__init__(files, max_in_flight=max_in_flight)

    def path_of(self, path: PathLike) -> str:
        return self.fs._strip_protocol(os.fspath(path))

    def __repr__(self) -> str:
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return f"<distckpt.FsspecStorage {protocol}>"
