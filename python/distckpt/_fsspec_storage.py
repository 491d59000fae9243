"""``FsspecStorage``: distckpt's storage callbacks over any fsspec filesystem (s3fs, gcsfs, adlfs, memory, ...), through
fsspec's public API only: files assembled in memory and uploaded on close (streamed as an S3 multipart upload where
s3fs is the filesystem), ranged reads served from blocks, and the metadata committed with an exclusive write.
Internal: ``distckpt.storage.FsspecStorage`` (and ``distckpt.FsspecStorage``) is the public name. fsspec itself is
imported by the caller that makes the filesystem, never here at import time.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any, List, Optional, Tuple

from ._backends import CallbackStorage, PathLike
from .errors import InvalidArgumentError


class _Upload:
    """A file being written: its bytes, assembled in memory at the offsets distckpt writes them.

    Published on close with one ``pipe_file``; or, on S3 (s3fs) for a file of at least two parts, streamed: a
    multipart upload starts at create, every part goes up as soon as distckpt has written all of its bytes (while the
    rest is still being written), and close sends what is left and completes the upload."""

    __slots__ = ("path", "buf", "lock", "part_size", "written", "parts", "upload_id")

    def __init__(self, path: str, size_hint: int) -> None:
        self.path = path
        self.buf: Optional[bytearray] = bytearray(size_hint)
        self.lock = threading.Lock()
        self.part_size = 0  # streaming: the part size (0: one pipe_file on close)
        self.written: "dict[int, int]" = {}  # streaming: part number -> bytes written into it so far
        self.parts: "dict[int, Any]" = {}  # streaming: part number -> future of its upload_part response
        self.upload_id = ""


class _Block:
    """A block of a data file fetched with one ranged GET, kept until every byte of it has been handed out."""

    __slots__ = ("ready", "data", "error", "served")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.data = b""
        self.error: Optional[BaseException] = None
        self.served = 0


class _Discard(Exception):
    """Internal: a streamed upload closed with discard."""


class _Restart(Exception):
    """Internal: a streamed upload to be redone in one piece."""


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
        f = _Upload(path, size_hint)
        part = self.upload_part_size
        if part and size_hint >= 2 * part:
            bucket, key, _ = self.fs.split_path(path)
            f.upload_id = self._s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
            f.part_size = part
        return f

    def write(self, f: _Upload, offset: int, data: memoryview) -> None:
        end = offset + len(data)
        buf = f.buf
        assert buf is not None, "write after close"
        if end > len(buf):
            with f.lock:
                if end > len(buf):
                    buf.extend(bytes(end - len(buf)))
        buf[offset:end] = data
        if f.part_size:
            self._count(f, offset, end)

    sync = None  # close uploads the whole file: once it returns the object is stored

    def close(self, f: _Upload, size: int, discard: bool) -> None:
        buf, f.buf = f.buf, None
        if buf is None:
            return
        if f.part_size:
            self._finish(f, buf, size, discard)
            return
        if discard:
            return
        if len(buf) < size:
            buf.extend(bytes(size - len(buf)))
        elif len(buf) > size:
            del buf[size:]
        self.fs.pipe_file(f.path, buf)  # bytes-like: s3fs and botocore take the bytearray itself, no copy

    # -- streaming multipart upload (s3fs) --

    def _s3(self, method: str, **kwargs: Any) -> Any:
        """One S3 call through s3fs's client, from any thread (it runs on the filesystem's event loop)."""
        import fsspec.asyn  # noqa: PLC0415 - fsspec is optional; only FsspecStorage needs it

        return fsspec.asyn.sync(self.fs.loop, self.fs._call_s3, method, **kwargs)

    def _count(self, f: _Upload, offset: int, end: int) -> None:
        """Counts the bytes written into each part [offset, end) touches; starts the upload of every full part whose
        bytes are all there (distckpt writes each byte once). The last part waits for close (its size is known
        then)."""
        ps = f.part_size
        full_parts = (len(f.buf or b"") // ps) - 1  # parts before the last one of the preallocated size
        ready = []
        with f.lock:
            for part in range(offset // ps, (end - 1) // ps + 1):
                lo, hi = max(offset, part * ps), min(end, (part + 1) * ps)
                n = f.written.get(part, 0) + hi - lo
                f.written[part] = n
                if n == ps and part < full_parts and part not in f.parts:
                    ready.append(part)
                    f.parts[part] = None  # claimed
        for part in ready:
            f.parts[part] = self._send(f, part, f.buf[part * ps : (part + 1) * ps])

    def _send(self, f: _Upload, part: int, body: bytearray) -> Any:
        """Starts the upload of one part (``body``: a copy, since botocore takes bytes or bytearray, not a view) on
        the filesystem's event loop; returns its future."""
        import asyncio  # noqa: PLC0415 - only streamed S3 uploads need it

        return asyncio.run_coroutine_threadsafe(self._upload_part(f, part, body), self.fs.loop)

    async def _upload_part(self, f: _Upload, part: int, body: bytearray) -> Any:
        bucket, key, _ = self.fs.split_path(f.path)
        return await self.fs._call_s3(
            "upload_part", Bucket=bucket, Key=key, UploadId=f.upload_id, PartNumber=part + 1, Body=body
        )

    def _finish(self, f: _Upload, buf: bytearray, size: int, discard: bool) -> None:
        """Waits for the parts in flight, sends the rest and completes the upload (or aborts it on discard or error;
        a file that ended before a part already sent goes up again in one piece)."""
        bucket, key, _ = self.fs.split_path(f.path)
        ps = f.part_size
        try:
            etags = {}
            for part, future in sorted(f.parts.items()):
                etags[part] = future.result()["ETag"]
            if discard:
                raise _Discard()
            if f.parts and (max(f.parts) + 1) * ps > size:  # shorter than what was streamed: start over
                raise _Restart()
            if len(buf) < size:
                buf.extend(bytes(size - len(buf)))
            last = max(1, -(-size // ps))  # parts in all (an empty file still needs one, empty)
            for part in range(last):  # the rest at once, through the same coroutine as the streamed parts
                if part not in f.parts:
                    f.parts[part] = self._send(f, part, buf[part * ps : min(size, (part + 1) * ps)])
            for part in range(last):
                if part not in etags:
                    etags[part] = f.parts[part].result()["ETag"]
            self._s3(
                "complete_multipart_upload", Bucket=bucket, Key=key, UploadId=f.upload_id,
                MultipartUpload={"Parts": [{"PartNumber": p + 1, "ETag": etags[p]} for p in range(last)]},
            )  # fmt: skip
            self.fs.invalidate_cache(f.path)
        except BaseException as e:
            for future in f.parts.values():
                if future is not None:
                    future.cancel()
            try:
                self._s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=f.upload_id)
            except Exception:  # noqa: BLE001 - the store cleans up unfinished uploads; the first error is the news
                pass
            if isinstance(e, _Discard):
                return
            if not isinstance(e, _Restart):
                raise
            del buf[size:]
            self.fs.pipe_file(f.path, buf)

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
    and uploaded with ``fs.pipe_file`` when distckpt closes it; on S3 through s3fs, a file of two parts or more is
    streamed instead: a multipart upload whose parts go up while the rest of the file is still being written. Reads
    are ranged ``fs.cat_file`` calls; the metadata is committed with ``fs.pipe_file(mode="create")`` (a conditional
    PUT on S3). Memory: a rank holds the files it is writing (at most ``max_in_flight`` writes at once, but whole
    files until they are closed).

    Args:
        fs: an ``fsspec.AbstractFileSystem``. Tune the store there (e.g. ``s3fs.S3FileSystem(max_concurrency=8)``
            for parallel multipart uploads of large files).
        max_in_flight: the most reads and writes distckpt runs at once (0: its default, 16).
        atomic_commit: use ``pipe_file(mode=...)`` for the commit (None: when the filesystem takes ``mode``).
        read_block_size: smaller reads of data files are served from blocks of this size, each fetched with one
            ranged read and dropped once all of it was handed out (fewer, larger GETs; at most 64 blocks held);
            0: every read is its own ranged read.
        upload_part_size: the part size of streamed uploads on S3 (at least 5 MiB, S3's smallest part); 0: no
            streaming, one ``pipe_file`` per file on close.
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
