"""Type stubs of the extension module (bindings/*.cc, one file per part): a thin binding of the C ABI, distckpt.h.

Buffers are any C-contiguous objects with the buffer protocol; for loads they must be writable. Timeouts are in
milliseconds, 0 meaning the library default. Callbacks run on distckpt threads with the GIL held.
"""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# Any object with the buffer protocol (numpy arrays, bytes, bytearray, memoryview).
Buffer = Any

ProgressFn = Callable[[int, int], Any]

ABI_VERSION: int
HEADER_VERSION: str
MAX_DIMS: int
STREAM_READY: int
DEVICE_OF_POINTER: int
WAIT_FOREVER: int
REPLICAS_AUTO: int
ENTRY_TENSOR: int
ENTRY_BYTES: int
STATUS: Dict[str, int]  # C names without the DCKPT_ prefix: "OK", "EINVAL", ...
DTYPES: Dict[str, int]  # C names without DCKPT_DTYPE_: "F32", "BF16", "F8_E4M3FN", ...

def _set_error_factory(factory: Callable[[int, str], BaseException]) -> None: ...
def version() -> int: ...
def version_string() -> str: ...
def abi_version() -> int: ...
def status_name(code: int) -> str: ...
def dtype_size(dtype: int) -> int: ...
def dtype_name(dtype: int) -> Optional[str]: ...
def dtype_from_name(name: str) -> int: ...

class Comm:
    @staticmethod
    def gloo(
        rank: int,
        world_size: int,
        rendezvous: Optional[str],
        prefix: Optional[str],
        iface: Optional[str],
        hostname: Optional[str],
        timeout_ms: int,
    ) -> Comm: ...
    @staticmethod
    def external(
        rank: int,
        size: int,
        allgather: Callable[[memoryview, memoryview, int], Any],
        broadcast: Callable[[memoryview, int, int], Any],
        barrier: Optional[Callable[[int], Any]],
    ) -> Comm: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def barrier(self, timeout_ms: int) -> None: ...
    def abort(self, reason: str) -> None: ...
    def close(self) -> None: ...

class State:
    def __init__(self) -> None: ...
    def add_tensor(self, name: str, dtype: int, shape: List[int]) -> None: ...
    def add_piece(self, name: str, offsets: List[int], lengths: List[int], data: Buffer, writable: bool) -> None: ...
    # A piece in CUDA device memory (DCKPT_MEMORY_CUDA): nbytes at ptr on device `device`, ordered on `stream` (a
    # CUstream as an integer; 0 is the legacy default stream). `owner` is kept alive as long as the State.
    def add_device_piece(
        self,
        name: str,
        offsets: List[int],
        lengths: List[int],
        ptr: int,
        nbytes: int,
        device: int,
        stream: int,
        owner: Any,
    ) -> None: ...
    def add_bytes(self, name: str, data: Buffer, writable: bool) -> None: ...
    def bytes_size(self, name: str) -> int: ...
    def set_user(self, key: str, value: str) -> None: ...
    def set_structure(self, data: bytes) -> None: ...

class SaveFuture:
    def wait(self, timeout_ms: int) -> Optional[Dict[str, Any]]: ...
    def done(self) -> bool: ...
    def staging(self) -> Tuple[float, int]: ...
    def snapshot(self) -> Tuple[int, int]: ...
    def free(self) -> None: ...

class MappedChunk:
    """A mapped chunk's bytes (buffer protocol, read-only); keeps the reader's mapping alive."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Reader:
    @staticmethod
    def open(
        path: str,
        comm: Optional[Comm],
        verify: bool,
        io_threads: int,
        timeout_ms: int,
        map_files: bool = True,
        share_verification: bool = True,
        pin_files: bool = True,
        fanout: int = 0,
        storage: Optional[Storage] = None,
    ) -> Reader: ...
    def load(self, state: State, comm: Optional[Comm], progress: Optional[ProgressFn]) -> Dict[str, int]: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def info(self) -> Dict[str, Any]: ...
    def entries(self) -> List[Tuple[str, int, int, Tuple[int, ...], int, int]]: ...
    def find(self, name: str) -> Optional[int]: ...
    def chunk(self, entry: int, chunk: int) -> Tuple[Tuple[int, ...], Tuple[int, ...], str, int, int, int]: ...
    def read(self, name: str, offsets: List[int], lengths: List[int], dst: Buffer) -> None: ...
    # dckpt_reader_read_ex into CUDA device memory; the copies have completed on return.
    def read_device(
        self, name: str, offsets: List[int], lengths: List[int], ptr: int, nbytes: int, device: int, stream: int
    ) -> None: ...
    def read_bytes(self, name: str) -> bytes: ...
    def user(self) -> Dict[str, str]: ...
    def structure(self) -> bytes: ...
    def verify(self, progress: Optional[ProgressFn]) -> None: ...
    def verify_chunk(self, entry: int, chunk: int) -> None: ...
    def map_all(self, entries: Optional[List[int]], progress: Any) -> None: ...
    def map_chunk(self, entry: int, chunk: int) -> MappedChunk: ...
    def io_stats(self) -> Dict[str, Any]: ...

def save(
    path: str,
    state: State,
    comm: Optional[Comm],
    io_threads: int,
    overwrite: bool,
    sync: bool,
    checksum_block_size: int,
    timeout_ms: int,
    progress: Optional[ProgressFn],
    storage: Optional[Storage] = None,
) -> Dict[str, Any]: ...
def save_async(
    path: str,
    state: State,
    comm: Optional[Comm],
    io_threads: int,
    overwrite: bool,
    sync: bool,
    checksum_block_size: int,
    timeout_ms: int,
    progress: Optional[ProgressFn],
    device_snapshot: bool = ...,
    storage: Optional[Storage] = None,
) -> SaveFuture: ...
def load(
    path: str,
    state: State,
    comm: Optional[Comm],
    verify: bool,
    io_threads: int,
    timeout_ms: int,
    progress: Optional[ProgressFn],
    map_files: bool = True,
    share_verification: bool = True,
    storage: Optional[Storage] = None,
) -> Dict[str, Any]: ...
def export_safetensors(
    ckpt_path: str,
    out_dir: str,
    max_shard_bytes: int,
    prefix: Optional[str],
    verify: bool,
    progress: Optional[ProgressFn],
    storage: Optional[Storage] = None,
    out_storage: Optional[Storage] = None,
    rename_rules: Sequence[Tuple[str, str]] = (),
    buffer_bytes: int = 0,
    io_threads: int = 0,
    comm: Optional[Comm] = None,
    timeout_ms: int = 0,
) -> None: ...

class Storage:
    @staticmethod
    def posix() -> Storage: ...
    @staticmethod
    def memory() -> Storage: ...
    @staticmethod
    def callbacks(impl: Any, max_in_flight: int = 0) -> Storage: ...
    # The storage a URL names: "s3://..." S3 from the AWS_* environment, a plain path POSIX (dckpt_storage_open_url).
    @staticmethod
    def open_url(url: str) -> Storage: ...
    # dckpt_storage_new_s3 (s3.cc): None and 0 take the AWS_* environment or the core's default; addressing is
    # "auto", "path" or "virtual".
    @staticmethod
    def s3(
        endpoint: Optional[str],
        region: Optional[str],
        access_key_id: Optional[str],
        secret_access_key: Optional[str],
        session_token: Optional[str],
        addressing: str,
        max_in_flight: int,
        max_attempts: int,
        request_timeout_seconds: float,
        part_size: int,
        read_block_size: int,
    ) -> Storage: ...
    @property
    def kind(self) -> str: ...
    @property
    def impl(self) -> Any: ...

def storage_list(storage: Optional[Storage], dir: str) -> List[str]: ...  # noqa: A002
def storage_read_file(storage: Optional[Storage], path: str) -> bytes: ...
def storage_stat(storage: Optional[Storage], path: str, grace_seconds: float) -> Dict[str, Any]: ...
def storage_remove_leftovers(
    storage: Optional[Storage], path: str, grace_seconds: float, dry_run: bool
) -> List[str]: ...
def storage_remove_checkpoint(storage: Optional[Storage], path: str) -> None: ...
def scan_leftovers(root: str, final_name: Optional[str], grace_seconds: float) -> List[Dict[str, Any]]: ...
def remove_leftover(path: str, grace_seconds: float) -> None: ...
def tiers_describe(dir: str) -> str: ...  # noqa: A002
def tiers_prune_abandoned(dir: str, dry_run: bool) -> List[str]: ...  # noqa: A002

# manager.cc: dckpt_manager_* (a checkpoint every step, in tiers). C names without DCKPT_TIER_: "NONE", "LOCAL",
# "PEER", "PERSISTENT".
TIERS: Dict[str, int]
PRIORITIES: Dict[str, int]  # dckpt_priority: DEFAULT, NORMAL, LOW, IDLE

class Manager:
    # Collective over comm (None: a single process); None and 0 take the core's defaults.
    @staticmethod
    def new(
        comm: Optional[Comm],
        local_dir: Optional[str],
        job: Optional[str],
        node_id: Optional[str],
        replicas: int,
        persistent_path: Optional[str],
        persistent_storage: Optional[Storage],
        persist_every: int,
        keep_local: int,
        keep_persistent: int,
        local_budget_bytes: int,
        timeout_ms: int,
        device_snapshot: bool,
        exchange_round_bytes: int,
        threads: int,
        background_priority: int,
        persist_compression: int,
        persist_compression_level: int,
        persist_incremental: bool,
        persist_full_every: int,
    ) -> Manager: ...
    def save(self, step: int, state: State, persist: bool) -> None: ...
    def wait(self, timeout_ms: int) -> None: ...
    def latest_step(self) -> Optional[int]: ...
    # dckpt_restore_info's fields (found, step, tier, bytes_local, bytes_from_peers, bytes_from_persistent, seconds)
    # plus "report" (dckpt_manager_restore_report).
    def restore(self, state: State, fallback: bool, use_persistent: bool) -> Dict[str, Any]: ...
    def restore_report(self) -> str: ...
    # dckpt_manager_stats's fields; may run while another thread is in save or wait
    def stats(self) -> Dict[str, Any]: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
