"""distckpt as the storage layer of torch.distributed.checkpoint (DCP): ``StorageWriter`` and ``StorageReader``.

``dcp.save(sd, storage_writer=distckpt.torch.StorageWriter(path))``, ``dcp.async_save(...)`` and
``dcp.load(sd, storage_reader=distckpt.torch.StorageReader(path))`` keep DCP's planners and state-dict helpers
(``get_state_dict`` / ``set_state_dict``, FSDP2, DTensor, TP) and write and read the distckpt format.

Save. DCP plans as usual (its planner flattens the state dict to fully qualified names and assigns every replicated
item to one rank); in ``write_data`` every rank hands distckpt the items DCP gave it, as Shards of the global tensors
(tensors) and decoded objects (DCP's byte items), and one collective distckpt save over the process group writes
them and commits the checkpoint atomically. Entry names are DCP's fully qualified names (``model.layers.0.weight``),
the same names ``distckpt.save`` gives a nested dict; the structure (nesting, lists) is DCP's own flattening mapping,
so ``distckpt.load(None, path)`` and every other client see the nested state. Objects are stored as distckpt objects:
JSON where it can represent them, pickle only with ``allow_pickle=True``. DCP's ``finish`` has nothing left to do:
the checkpoint is already committed when ``write_data`` returns.

Load. The reader presents any distckpt checkpoint (written through DCP, by ``distckpt.save``, JAX, C++, Rust or Go)
as DCP metadata: each tensor as one chunk covering it, each object as a byte item. DCP's load planner then asks for
the regions each rank needs, and the reader reads exactly those regions (checksums verified) into the planner's
tensors; objects are decoded (JSON; pickle only with ``allow_pickle``) and handed to the planner. No collective is
needed to read: each rank opens the checkpoint itself.
"""

from __future__ import annotations

import io
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.storage import StorageReader as _DcpStorageReader
from torch.distributed.checkpoint.storage import StorageWriter as _DcpStorageWriter
from torch.distributed.checkpoint.storage import WriteResult

from . import _arrays, _checkpoint, _dtypes, _native, _tree
from . import storage as _storage
from .comm import Communicator, from_torch
from .errors import InvalidArgumentError
from .reader import Reader
from .sharding import Shard

__all__ = ["StorageWriter", "StorageReader"]

PathLike = Union[str, "os.PathLike[str]"]
ObjPath = Tuple[Any, ...]


def _done(value: Any) -> "torch.futures.Future[Any]":
    """A completed torch future (what DCP waits on)."""
    f: torch.futures.Future[Any] = torch.futures.Future()
    f.set_result(value)
    return f


class _Leaf:
    """A placeholder for entry ``fqn`` in the nest the structure is built from."""

    __slots__ = ("fqn",)

    def __init__(self, fqn: str) -> None:
        self.fqn = fqn


def _structure(paths: Dict[str, ObjPath], encodings: Dict[str, str]) -> Dict[str, Any]:
    """distckpt's structure node for DCP's flattening: fqn -> object path (keys and list indices). Integer steps
    are list indices, as DCP unflattens them; every fqn in ``encodings`` is an object, the rest are arrays."""
    steps = [tuple((isinstance(k, int) and not isinstance(k, bool), k) for k in p) for p in paths.values()]
    tree = _tree.nest(steps, [_Leaf(fqn) for fqn in paths])

    def node(x: Any) -> Dict[str, Any]:
        if isinstance(x, _Leaf):
            return {"object": x.fqn, "encoding": encodings[x.fqn]} if x.fqn in encodings else {"array": x.fqn}
        if isinstance(x, list):
            return {"list": [node(v) for v in x]}
        return {"dict": [[k, node(v)] for k, v in x.items()]}

    return node(tree)


class StorageWriter(_DcpStorageWriter):
    """DCP's ``StorageWriter`` writing a distckpt checkpoint at ``path`` (or at the ``checkpoint_id`` DCP passes).

    Args:
        path: the checkpoint directory (or URL; see :mod:`distckpt.storage`). ``dcp.save(checkpoint_id=...)``
            overrides it.
        process_group: the ranks that save together (None: torch.distributed's default group when it is initialized,
            else this process alone). distckpt's collectives run over it (``distckpt.comm.from_torch``); with
            ``dcp.async_save`` pass the same (gloo) group DCP uses.
        overwrite: replace a checkpoint already at the path, atomically (DCP's ``FileSystemWriter`` overwrites too).
        allow_pickle: store objects JSON cannot represent with pickle (loading them then needs it too).
        sync, io_threads, checksum_block_size, timeout, storage: as for :func:`distckpt.save`.
        incremental: each save of this writer is an incremental save (docs/incremental.md) of the previous checkpoint
            it wrote, when that one is in the same directory (``checkpoint_id`` ``ckpt/step-200`` after
            ``ckpt/step-100``): tensors whose bytes did not change are referred to, not written again. The training
            loop does not change; prune with distckpt's tools, which keep what later checkpoints refer to.
        full_every: with ``incremental``, every ``full_every``-th save of a chain is written whole (0: never).
        compression, compression_level: as for :func:`distckpt.save` (``"zstd"``: docs/compression.md); loads need
            nothing more.
    """

    def __init__(
        self, path: Optional[PathLike] = None, *, process_group: Any = None, overwrite: bool = True,
        allow_pickle: bool = False, sync: bool = True, io_threads: int = 0, checksum_block_size: int = 0,
        timeout: Optional[float] = None, storage: Optional[_storage.Storage] = None, incremental: bool = False,
        full_every: int = 0, compression: Optional[str] = None, compression_level: int = 0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.path = os.fspath(path) if path is not None else None
        self.process_group = process_group
        self.overwrite = overwrite
        self.allow_pickle = allow_pickle
        self.sync = sync
        self.io_threads = io_threads
        self.checksum_block_size = checksum_block_size
        self.timeout = timeout
        self.storage = storage
        self.incremental = incremental
        self.full_every = full_every
        _checkpoint.compression_code(compression)  # a bad value fails here, not at the first save
        self.compression = compression
        self.compression_level = compression_level
        self._last: Optional[str] = None  # the checkpoint this writer committed last (an incremental save's base)
        self.summary: Optional[_checkpoint.SaveSummary] = None  #: the last save's summary

    def _base(self) -> Optional[str]:
        """The previous checkpoint of this writer, when it lies beside this one (a base must be a sibling)."""
        if not self.incremental or self._last is None or self.path is None:
            return None
        last, here = self._last.rstrip("/"), self.path.rstrip("/")
        if last == here or os.path.dirname(last) != os.path.dirname(here):
            return None
        return last

    def reset(self, checkpoint_id: Optional[PathLike] = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self.summary = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self.path is None:
            raise InvalidArgumentError("distckpt.torch.StorageWriter: no path (pass one, or checkpoint_id to dcp.save)")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        return plans

    def _comm(self) -> Optional[Communicator]:
        if dist.is_available() and dist.is_initialized():
            return from_torch(self.process_group)
        return None

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "torch.futures.Future[List[WriteResult]]":
        assert self.path is not None
        comm = self._comm()
        results: List[WriteResult] = []
        tensors: Dict[str, List[Shard]] = {}
        objects: Dict[str, Any] = {}
        with _checkpoint.abort_on_local_error(comm):
            for item in plan.items:
                fqn = item.index.fqn
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    # DCP serialised the object with torch.save just now, in this process: read it back to store it
                    # as a distckpt object (JSON, readable without Python), not as an opaque pickle.
                    data.seek(0)
                    objects[fqn] = torch.load(data, weights_only=False)
                    results.append(WriteResult(index=item.index, size_in_bytes=data.getbuffer().nbytes,
                                               storage_data=fqn))  # fmt: skip
                    continue
                td = item.tensor_data
                assert td is not None
                tensor = data.detach()
                if tensor.device.type != "cpu":
                    tensor = tensor.cpu()  # DCP stages to host for async saves already; plain saves copy here
                offsets = tuple(int(o) for o in td.chunk.offsets)
                tensors.setdefault(fqn, []).append(Shard(tensor, tuple(int(d) for d in td.size), offsets))
                results.append(WriteResult(index=item.index, size_in_bytes=tensor.numel() * tensor.element_size(),
                                           storage_data=fqn))  # fmt: skip
            state = _native.State()
            encodings: Dict[str, str] = {}
            for fqn, shards in tensors.items():
                _checkpoint.add_leaf(state, fqn, shards, True, self.allow_pickle)
            for fqn, value in objects.items():
                encodings[fqn] = _checkpoint.add_leaf(state, fqn, value, False, self.allow_pickle) or "json"
        mapping = plan.planner_data if isinstance(plan.planner_data, dict) else None
        paths: Dict[str, ObjPath] = {}
        if mapping and all(isinstance(v, tuple) for v in mapping.values()):
            paths = {fqn: tuple(path) for fqn, path in mapping.items()}
        # Top-level scalars (step, epoch) are user metadata too, as distckpt.save records them.
        user = {fqn: text for fqn, value in objects.items() if len(paths.get(fqn, (fqn,))) == 1
                for text in [_tree.scalar_text(value)] if text is not None}  # fmt: skip
        # The structure and the user metadata: rank 0's are the ones kept, and they must cover the objects DCP gave to
        # other ranks too.
        if comm is not None:
            gathered: List[Any] = [None] * dist.get_world_size(self.process_group)
            dist.all_gather_object(gathered, (encodings, user), group=self.process_group)
            for other_encodings, other_user in gathered:
                encodings.update(other_encodings)
                user.update(other_user)
        for key, text in user.items():
            state.set_user(key, text)
        for fqn in list(tensors) + list(encodings):
            paths.setdefault(fqn, (fqn,))
        state.set_structure(_tree.dump_structure(_structure(paths, encodings)))
        self.summary = _checkpoint.save_state(
            state, self.path, comm, self.overwrite, self.sync, self.io_threads, self.checksum_block_size,
            self.timeout, None, self.storage, self._base(), self.full_every, self.compression, self.compression_level,
        )  # fmt: skip
        self._last = self.path
        return _done(results)

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        pass  # committed by write_data's collective save

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


class StorageReader(_DcpStorageReader):
    """DCP's ``StorageReader`` over any distckpt checkpoint at ``path`` (or the ``checkpoint_id`` DCP passes).

    Args:
        path: the checkpoint directory (or URL). ``dcp.load(checkpoint_id=...)`` overrides it.
        allow_pickle: decode objects that were stored with pickle.
        verify: check the checksums of every block read.
        storage: where the checkpoint lives (:mod:`distckpt.storage`).
    """

    def __init__(
        self, path: Optional[PathLike] = None, *, allow_pickle: bool = False, verify: bool = True,
        storage: Optional[_storage.Storage] = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.path = os.fspath(path) if path is not None else None
        self.allow_pickle = allow_pickle
        self.verify = verify
        self.storage = storage
        self._reader: Optional[Reader] = None
        self._native: Optional[_native.Reader] = None  # the reader's native handle: read_data loads through it

    def reset(self, checkpoint_id: Optional[PathLike] = None) -> None:
        self.close()
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    def close(self) -> None:
        """Closes the checkpoint (done by the next reset as well)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
            self._native = None

    def _open(self) -> Reader:
        if self._reader is None:
            if self.path is None:
                raise InvalidArgumentError("distckpt.torch.StorageReader: no path (pass one, or checkpoint_id)")
            # Opened as distckpt.open does, keeping the native handle: read_data puts a plan's regions into one load.
            native_path, native_storage, _ = _storage.resolve(self.path, self.storage)
            native = _native.Reader.open(native_path, None, self.verify, 0, 0, storage=native_storage)
            try:
                self._reader = Reader(native, self.path, self.allow_pickle)
            except BaseException:
                native.close()
                raise
            self._native = native
        return self._reader

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        reader = self._open()
        entries: Dict[str, Any] = {}
        for name, entry in reader.metadata.items():
            if entry.kind == "bytes":
                entries[name] = BytesStorageMetadata()
                continue
            shape = torch.Size(entry.shape)
            chunk = ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=shape)
            props = TensorProperties(dtype=_arrays.torch_dtype(_dtypes.code_of_name(entry.dtype)))
            entries[name] = TensorStorageMetadata(properties=props, size=shape, chunks=[chunk])
        planner_data: Dict[str, ObjPath] = {name: (name,) for name in entries}
        root = reader.structure
        if root is not None:
            planner_data.update(_object_paths(root))
        return Metadata(state_dict_metadata=entries, planner_data=planner_data)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._open()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "torch.futures.Future[None]":
        reader = self._open()
        # Every host region of the plan goes into one native load, which reads them in parallel (io_threads) and
        # verifies them; regions of another dtype or layout go through a temporary tensor copied afterwards.
        state = _native.State()
        declared: set = set()
        after: List[Tuple[Any, Any, Any]] = []  # (item, target, temporary or None) in plan order
        device: List[Tuple[Any, Any, Tuple[int, ...], Tuple[int, ...]]] = []
        for item in plan.items:
            name = item.storage_index.fqn
            if item.type == LoadItemType.BYTE_IO:
                buf = io.BytesIO()
                torch.save(reader.read(name), buf)  # decoded by distckpt's rules, re-serialised for the planner
                buf.seek(0)
                planner.load_bytes(item, buf)
                continue
            # The checkpoint's only chunk of a tensor starts at the origin (read_metadata), so the offsets into it
            # are global offsets.
            offsets = tuple(int(o) for o in item.storage_offsets)
            lengths = tuple(int(n) for n in item.lengths)
            target = planner.resolve_tensor(item).detach()
            entry = reader.metadata[name]
            code = _dtypes.code_of_name(entry.dtype)
            stored = _arrays.torch_dtype(code)
            direct = target.dtype == stored and target.is_contiguous()
            if direct and target.device.type == "cuda" and torch.version.hip is None:
                device.append((item, target, offsets, lengths))  # straight into device memory, below
                continue
            if name not in declared:
                state.add_tensor(name, code, list(entry.shape))
                declared.add(name)
            buf = target if direct and target.device.type == "cpu" else torch.empty(lengths, dtype=stored)
            state.add_piece(name, list(offsets), list(lengths), _arrays.bytes_view(_arrays.torch_raw_numpy(buf)),
                            True)  # fmt: skip
            after.append((item, target, None if buf is target else buf))
        if declared:
            assert self._native is not None
            self._native.load(state, None, None)
        for item, target, tmp in after:
            if tmp is not None:
                target.copy_(tmp)
            planner.commit_tensor(item, target)
        for item, target, offsets, lengths in device:
            reader[item.storage_index.fqn].read(offsets, lengths, out=target)
            planner.commit_tensor(item, target)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


def _object_paths(root: Dict[str, Any]) -> Dict[str, ObjPath]:
    """fqn -> object path (dict keys and list indices) of every leaf in a distckpt structure."""
    out: Dict[str, ObjPath] = {}

    def visit(node: Dict[str, Any], path: ObjPath) -> None:
        if "dict" in node:
            for key, child in node["dict"]:
                visit(child, path + (key,))
        elif "list" in node or "tuple" in node:
            for i, child in enumerate(node.get("list", node.get("tuple"))):
                visit(child, path + (i,))
        else:
            out[_tree.leaf_name(node)] = path

    visit(root, ())
    return out
