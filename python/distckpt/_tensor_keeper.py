"""Keeps the tensors handed to torch.distributed collectives alive until torch has let go of them.

A collective's work object (gloo's runloop, NCCL's watchdog) holds the tensors it was given and drops them on torch's
own thread some time after the call has returned. If Python's last reference went first, that drop frees the Python
object there, taking the GIL; once the interpreter is finalizing, taking the GIL ends the thread, and the forced unwind
through torch's destructor aborts the process ("terminate called without an active exception"; seen in about one
run in five of a two-rank program whose last collective was distckpt's). So each tensor is held here until torch's
reference count on it is ours alone, which is checked whenever more are held and, at exit, waited for (bounded).
Tensors torch still holds after that wait are never released, so that no torch thread can free a Python object.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
import time
from typing import Any, List

#: How long the exit handler waits for torch's threads to drop the last collectives' tensors.
EXIT_WAIT_S = 5.0

_lock = threading.Lock()
_held: List[Any] = []


def _released(t: Any) -> bool:
    # Ours (this list) is the only reference left to the tensor's storage handle: the work object has gone.
    return t._use_count() <= 1


def hold(*tensors: Any) -> None:
    """Holds ``tensors`` (given to a collective) until torch has dropped them; releases those it already has."""
    with _lock:
        _held[:] = [t for t in _held if not _released(t)]
        _held.extend(tensors)


def pending() -> int:
    """How many held tensors torch still references."""
    with _lock:
        return sum(1 for t in _held if not _released(t))


def _wait_at_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    while True:
        with _lock:
            _held[:] = [t for t in _held if not _released(t)]
            if not _held:
                return
            if time.monotonic() >= deadline:
                for t in _held:  # never freed: a torch thread must not be the one to free them
                    ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))
                return
        time.sleep(0.001)


atexit.register(_wait_at_exit)
