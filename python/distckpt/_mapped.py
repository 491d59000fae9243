"""Zero-copy access to a whole checkpoint: numpy views over the reader's mappings of its data files (Reader.map_all).

The views are read-only and keep the mapping alive (each holds a buffer that pins the native reader), so they stay
valid after the reader is closed. Verification is the core's: up front (dckpt_reader_map_all checks every checksum
while it pages the files in) or on first touch (dckpt_reader_verify_chunk the first time a tensor is taken).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import numpy as np

from .errors import NotFoundError

__all__ = ["MappedTensors"]


def _mappable(entry: Any) -> bool:
    """One chunk: one view, of the mapped file (raw), or of the bytes the core decoded (compressed)."""
    return bool(entry.num_chunks == 1)


def _compressed(entry: Any) -> bool:
    return any(c.codec != "none" for c in entry.chunks)


class MappedTensors(Mapping[str, np.ndarray]):
    """Tensor name -> read-only numpy array over the mapped file (see :meth:`distckpt.Reader.map_all`)."""

    def __init__(
        self,
        reader: Any,
        native: Any,
        names: Optional[Sequence[str]],
        lazy: bool,
        progress: Optional[Callable[[int, int], Any]],
    ) -> None:
        meta = reader.metadata
        self._path = reader.path
        self._native = native
        self._format = meta.format
        self._user = dict(meta.user)
        self._verify_on_touch = lazy and meta.checksummed
        wanted = list(names) if names is not None else [n for n, e in meta.items() if e.kind == "tensor"]
        self._entries: Dict[str, Any] = {}
        for name in wanted:
            entry = meta.get(name)
            if entry is None:
                raise NotFoundError(f"checkpoint '{self._path}' has no entry '{name}'")
            if entry.kind != "tensor":
                raise NotFoundError(f"checkpoint '{self._path}': entry '{name}' is a bytes entry, not a tensor")
            self._entries[name] = entry
        self._arrays: Dict[str, np.ndarray] = {}
        #: tensors stored as several chunks (read into memory), or compressed (decoded by the core into memory the
        #: reader keeps): not views of the file
        self.copied: List[str] = []
        if not lazy:
            indices = [e.index for e in self._entries.values() if _mappable(e)]
            native.map_all(indices, progress)
            for name in self._entries:
                self._arrays[name] = self._take(name, reader)
        else:
            self._reader: Any = reader

    def _take(self, name: str, reader: Any) -> np.ndarray:
        entry = self._entries[name]
        if not _mappable(entry):
            a = reader.read(name)
            self.copied.append(name)
        else:
            if _compressed(entry):
                self.copied.append(name)  # decoded (and verified, as a read is) by map_chunk
            elif self._verify_on_touch:
                self._native.verify_chunk(entry.index, 0)
            buf = self._native.map_chunk(entry.index, 0)
            a = np.frombuffer(buf, dtype=entry.numpy_dtype).reshape(entry.shape)
        a.flags.writeable = False
        return a

    def __getitem__(self, name: str) -> np.ndarray:
        a = self._arrays.get(name)
        if a is None:
            if name not in self._entries:
                raise KeyError(name)
            a = self._arrays[name] = self._take(name, self._reader)
        return a

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    # safetensors.safe_open's names, so that code written for it runs unchanged on the result.
    def get_tensor(self, name: str) -> np.ndarray:
        return self[name]

    def metadata(self) -> Dict[str, str]:
        """The checkpoint's user key/values (a safetensors file's ``__metadata__``)."""
        return dict(self._user)

    def __repr__(self) -> str:
        return f"<distckpt.MappedTensors {self._path!r} ({self._format}), {len(self)} tensors>"
