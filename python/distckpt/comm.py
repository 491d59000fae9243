"""Communicators: the group of ranks that save or load a checkpoint together.

- :func:`gloo` connects the ranks over TCP with distckpt's own Gloo backend (no other framework needed).
- :func:`from_torch` and :func:`from_mpi4py` reuse a process group the application already has, through the C ABI's
  external-communicator callbacks; :func:`external` does the same for any other host.

Pass the result as ``comm=`` to save, async_save, load and open. Collective calls must be made by every rank, in the
same order, one at a time per communicator.
"""

from __future__ import annotations

import atexit
import os
from typing import Any, Callable, Optional

from . import _native, _tensor_keeper
from .errors import InvalidArgumentError, StateError

__all__ = ["Communicator", "gloo", "from_torch", "from_mpi4py", "external"]

AllgatherFn = Callable[[memoryview, memoryview, int], None]
BroadcastFn = Callable[[memoryview, int, int], None]
BarrierFn = Callable[[int], None]


class Communicator:
    """A group of ranks. Close it (or use it as a context manager) when done; async saves keep it alive meanwhile."""

    def __init__(self, native: "_native.Comm", kind: str, keepalive: Any = None) -> None:
        self._native: Optional[_native.Comm] = native
        self._kind = kind
        self._keepalive = keepalive  # the host objects the callbacks use

    @property
    def native(self) -> "_native.Comm":
        if self._native is None:
            raise StateError("the communicator is closed")
        return self._native

    @property
    def rank(self) -> int:
        return int(self.native.rank)

    @property
    def size(self) -> int:
        return int(self.native.size)

    @property
    def kind(self) -> str:
        """ "gloo", "torch", "mpi4py" or "external"."""
        return self._kind

    def barrier(self, timeout: Optional[float] = None) -> None:
        """Waits until every rank arrives; distckpt.TimeoutError names a missing rank after ``timeout`` seconds."""
        self.native.barrier(_native.timeout_ms(timeout))

    def abort(self, reason: str) -> None:
        """Tells the other ranks this rank cannot take part (it failed before reaching a collective): with Gloo its
        connections close, so ranks waiting on it fail at once, naming it. The communicator is unusable afterwards.
        ``save``/``load``/``async_save`` call this themselves when they fail before their first collective."""
        self.native.abort(reason)

    def close(self) -> None:
        """Releases the communicator. Safe to call twice; raises StateError while an async save still uses it."""
        if self._native is not None:
            self._native.close()
            self._native = None
            self._keepalive = None

    @property
    def closed(self) -> bool:
        return self._native is None

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._native is None:
            return f"<distckpt.Communicator {self._kind} closed>"
        return f"<distckpt.Communicator {self._kind} rank {self.rank} of {self.size}>"


def native_of(comm: Optional[Communicator]) -> Optional["_native.Comm"]:
    if comm is None:
        return None
    if not isinstance(comm, Communicator):
        raise InvalidArgumentError(
            f"comm must be a distckpt.comm.Communicator (from distckpt.comm.gloo/from_torch/from_mpi4py) or None, "
            f"not {type(comm).__name__}"
        )
    return comm.native


def gloo(
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    *,
    rendezvous: Optional[str] = None,
    prefix: Optional[str] = None,
    iface: Optional[str] = None,
    hostname: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Communicator:
    """Connects this rank to the others with Gloo over TCP. Collective: every rank calls it.

    Args:
        rank, world_size: None takes them from the environment (DCKPT_RANK / DCKPT_WORLD_SIZE, else RANK /
            WORLD_SIZE, as torchrun sets them).
        rendezvous: where the ranks find each other: ``"file:///shared/dir"`` (a directory every rank can reach) or
            ``"redis://host:port"``; None: DCKPT_RENDEZVOUS.
        prefix: a namespace in the store (e.g. a job id), so that several groups can share one.
        iface, hostname: the network interface or address to bind; None: DCKPT_GLOO_IFACE / DCKPT_GLOO_HOSTNAME,
            else Gloo's default.
        timeout: seconds for the rendezvous and the default collective timeout; None: DCKPT_TIMEOUT_MS, else 10
            minutes.
    """
    native = _native.Comm.gloo(
        -1 if rank is None else int(rank),
        -1 if world_size is None else int(world_size),
        None if rendezvous is None else os.fspath(rendezvous),
        prefix,
        iface,
        hostname,
        _native.timeout_ms(timeout),
    )
    return Communicator(native, "gloo")


def external(
    rank: int,
    size: int,
    allgather: AllgatherFn,
    broadcast: BroadcastFn,
    barrier: Optional[BarrierFn] = None,
    *,
    kind: str = "external",
    keepalive: Any = None,
) -> Communicator:
    """A communicator whose collectives are Python callables (the C ABI's external communicator).

    distckpt calls them from its own threads, holding the GIL, one at a time:

    - ``allgather(send, recv, timeout_ms)``: every rank passes ``len(send)`` bytes (the same on every rank);
      ``recv`` (``size * len(send)`` bytes) receives every rank's bytes in rank order.
    - ``broadcast(buf, root, timeout_ms)``: rank ``root``'s bytes replace every other rank's ``buf``.
    - ``barrier(timeout_ms)`` (optional; by default an allgather of one byte).

    The memoryviews are valid only during the call. An exception aborts the distckpt operation on this rank with
    CallbackError (whose ``__cause__`` is the exception); the other ranks fail too.
    """
    native = _native.Comm.external(int(rank), int(size), allgather, broadcast, barrier)
    return Communicator(native, kind, keepalive)


def from_torch(process_group: Any = None) -> Communicator:
    """Runs distckpt's collectives over a ``torch.distributed`` process group (None: the default group).

    Works with every backend (gloo, nccl: byte buffers travel as uint8 tensors on the backend's device). The
    process group's own timeout applies; distckpt's per-call timeouts cannot shorten it.
    """
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError("from_torch: torch.distributed is not initialized (call init_process_group first)")
    group = process_group if process_group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    backend = str(dist.get_backend(group)).lower()
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    is_world = group is dist.group.WORLD or group is None

    def global_rank(group_rank: int) -> int:
        return group_rank if is_world else dist.get_global_rank(group, group_rank)  # type: ignore[arg-type]

    def to_tensor(view: memoryview) -> Any:
        t = torch.empty(len(view), dtype=torch.uint8)
        if len(view):
            t.numpy()[:] = np.frombuffer(view, dtype=np.uint8)
        return t.to(device)

    def copy_out(t: Any, view: memoryview) -> None:
        if len(view):
            np.frombuffer(view, dtype=np.uint8)[:] = t.cpu().numpy()

    def allgather(send: memoryview, recv: memoryview, timeout_ms: int) -> None:
        n = len(send)
        if n == 0:
            return
        mine = to_tensor(send)
        out = torch.empty(size * n, dtype=torch.uint8, device=device)
        _tensor_keeper.hold(mine, out)  # until torch's thread has dropped them (_tensor_keeper)
        try:
            dist.all_gather_into_tensor(out, mine, group=group)
        except (RuntimeError, NotImplementedError, AttributeError):  # backends without the fused collective
            parts = [torch.empty(n, dtype=torch.uint8, device=device) for _ in range(size)]
            _tensor_keeper.hold(*parts)
            dist.all_gather(parts, mine, group=group)
            out = torch.cat(parts)
        copy_out(out, recv)

    def broadcast(buf: memoryview, root: int, timeout_ms: int) -> None:
        if len(buf) == 0:
            return
        t = to_tensor(buf)
        _tensor_keeper.hold(t)
        dist.broadcast(t, src=global_rank(root), group=group)
        if rank != root:
            copy_out(t, buf)

    return external(rank, size, allgather, broadcast, None, kind="torch", keepalive=group)


# Process groups made for the background collectives of async saves, one per training group (by identity), kept for
# the life of the process: a group is a set of connections, and making one per save would pile them up.
_background_groups: dict = {}


@atexit.register
def _drop_background_groups() -> None:
    # Before the interpreter finalizes: a process group freed during finalization joins torch's worker threads, and
    # one that still releases a tensor then needs the GIL, which aborts the process. Async saves are waited for
    # first (atexit runs handlers last-registered first; _checkpoint registers its wait after importing this).
    entries = list(_background_groups.values())
    _background_groups.clear()
    for _, comm in entries:
        comm.close()


def for_background(comm: Optional[Communicator]) -> Optional[Communicator]:
    """The communicator an asynchronous save runs its background collectives on, for ``comm``.

    An async save's planning and commit run on a background thread while training goes on. Over a
    ``from_torch`` communicator those collectives would share the training's process group: on each rank they
    interleave with the training's own collectives in a different order, and the ranks then hang or mix payloads. So a
    torch communicator is replaced by one over a process group of its own (gloo, the same ranks), made on the first
    async save over that group and reused after (collective: every rank of the group makes it in the same call, which
    async_save, being collective, guarantees). Other communicators are returned as they are: distckpt's Gloo
    communicator is distckpt's own (use it only for distckpt while a save runs), and whether a communicator may run
    in the background at all is the core's rule, applied to whatever is passed on (it refuses distckpt's NCCL
    communicator, saying to pass a Gloo one), so it is not repeated here.
    """
    if comm is None or comm.kind != "torch" or comm.closed:
        return comm
    import torch.distributed as dist  # noqa: PLC0415

    group = comm._keepalive
    key = id(group)
    entry = _background_groups.get(key)
    if entry is None or entry[0] is not group:
        world = group is None or group is dist.group.WORLD
        ranks = None if world else dist.get_process_group_ranks(group)
        kwargs = {} if world else {"use_local_synchronization": True}  # only the group's ranks call this
        own = dist.new_group(ranks=ranks, backend="gloo", **kwargs)
        entry = (group, from_torch(own))
        _background_groups[key] = entry
    return entry[1]


def from_mpi4py(comm: Any) -> Communicator:
    """Runs distckpt's collectives over an mpi4py communicator (``MPI.COMM_WORLD`` or a sub-communicator)."""
    from mpi4py import MPI  # noqa: PLC0415

    def allgather(send: memoryview, recv: memoryview, timeout_ms: int) -> None:
        comm.Allgather([send, MPI.BYTE], [recv, MPI.BYTE])

    def broadcast(buf: memoryview, root: int, timeout_ms: int) -> None:
        comm.Bcast([buf, MPI.BYTE], root=root)

    def barrier(timeout_ms: int) -> None:
        comm.Barrier()

    return external(comm.Get_rank(), comm.Get_size(), allgather, broadcast, barrier, kind="mpi4py", keepalive=comm)
