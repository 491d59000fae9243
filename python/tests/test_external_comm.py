"""The external-communicator path (what from_torch and from_mpi4py use), with Python threads as ranks.

Each thread is a rank whose collectives are Python callables meeting at a threading.Barrier. This works only because
the native calls release the GIL and the callbacks take it back on distckpt's threads.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import distckpt


class ThreadGroup:
    """Collectives between threads of one process."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=30)
        self.slots = [b""] * size

    def comm(self, rank: int, fail_allgather: bool = False) -> distckpt.comm.Communicator:
        def allgather(send, recv, timeout_ms):
            if fail_allgather:
                self.barrier.abort()  # the other ranks' collectives fail at once instead of waiting
                raise RuntimeError(f"rank {rank}: simulated network failure")
            self.slots[rank] = bytes(send)
            self.barrier.wait()
            recv[:] = b"".join(self.slots)
            self.barrier.wait()

        def broadcast(buf, root, timeout_ms):
            if rank == root:
                self.slots[root] = bytes(buf)
            self.barrier.wait()
            if rank != root:
                buf[:] = self.slots[root]
            self.barrier.wait()

        return distckpt.comm.external(rank, self.size, allgather, broadcast)

    def run(self, fn, comm_kwargs=None):
        results = [None] * self.size

        def main(rank):
            try:
                with self.comm(rank, **(comm_kwargs or {}).get(rank, {})) as comm:
                    results[rank] = ("ok", fn(rank, comm))
            except BaseException as e:  # noqa: BLE001
                results[rank] = ("error", e)

        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "a rank is stuck"
        return results


FULL = np.arange(11 * 5, dtype=np.float64).reshape(11, 5)


def test_three_thread_ranks_save_and_two_load_resharded(tmp_path):
    path = str(tmp_path / "c")

    def save(rank, comm):
        lo, hi = [0, 4, 8, 11][rank], [0, 4, 8, 11][rank + 1]
        state = {"w": distckpt.Shard(FULL[lo:hi].copy(), FULL.shape, (lo, 0)), "tag": "run-1", "step": 5}
        return distckpt.save(state, path, comm=comm)

    results = ThreadGroup(3).run(save)
    assert [r[0] for r in results] == ["ok"] * 3, results
    assert {r[1].total_bytes for r in results} == {results[0][1].total_bytes}

    def load(rank, comm):
        cols = [(0, 3), (3, 5)][rank]
        local = np.zeros((11, cols[1] - cols[0]))
        state = {"w": distckpt.Shard(local, FULL.shape, (0, cols[0])), "step": None}
        distckpt.load(state, path, comm=comm)
        np.testing.assert_array_equal(local, FULL[:, cols[0] : cols[1]])
        with distckpt.open(path, comm=comm) as r:
            return state["step"], r["tag"]

    results = ThreadGroup(2).run(load)
    assert results == [("ok", (5, "run-1")), ("ok", (5, "run-1"))], results


def test_a_failing_collective_fails_every_rank_and_keeps_the_cause(tmp_path):
    def save(rank, comm):
        return distckpt.save({"a": np.ones(3)}, str(tmp_path / "c"), comm=comm, timeout=20)

    results = ThreadGroup(3).run(save, comm_kwargs={1: {"fail_allgather": True}})
    assert all(kind == "error" for kind, _ in results), results
    err = results[1][1]
    assert isinstance(err, distckpt.CallbackError) and isinstance(err.__cause__, RuntimeError)
    assert "simulated network failure" in str(err.__cause__)
    for _kind, e in results:
        assert isinstance(e, distckpt.Error)
    with pytest.raises(distckpt.NotFoundError):
        distckpt.open(tmp_path / "c")


def test_from_mpi4py_single_process():
    MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py (and an MPI library) is not installed")
    with distckpt.comm.from_mpi4py(MPI.COMM_SELF) as comm:
        assert (comm.rank, comm.size, comm.kind) == (0, 1, "mpi4py")
        comm.barrier(timeout=10)
