"""``python -m distckpt``: offline conversions and a quick look inside a checkpoint.

    python -m distckpt export-safetensors CKPT OUT_DIR [--max-shard-size 5GB] [--prefix model]
    python -m distckpt import-safetensors SRC [SRC ...] CKPT [--overwrite]
    python -m distckpt import-dcp DCP_DIR CKPT [--overwrite] [--allow-pickle]
    python -m distckpt consolidate CKPT OUT [--format torch|safetensors] [--max-memory 256MiB] [--overwrite]
    python -m distckpt import-torch FILE.pt CKPT [--overwrite] [--unsafe-pickle] [--no-mmap]
    python -m distckpt info CKPT

Progress bars go to stderr, and only when it is a terminal. Exit status: 0 on success, 1 on a distckpt error (the
message is printed), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, List, Optional, TextIO

from . import Error, export_safetensors, import_safetensors, import_torch_dcp
from . import open as open_checkpoint
from .consolidate import consolidate, import_torch_save


class ProgressBar:
    """A one-line progress bar on a terminal; does nothing when the stream is not one."""

    def __init__(self, label: str, stream: TextIO = sys.stderr, enabled: Optional[bool] = None) -> None:
        self.label = label
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self._last = 0.0
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        frac = done / total if total else 1.0
        width = 30
        bar = "#" * int(frac * width)
        self.stream.write(f"\r{self.label} [{bar:<{width}}] {frac:6.1%} {_human(done)}/{_human(total)}")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _with_progress(label: str, quiet: bool, run: Callable[[Optional[Callable[[int, int], None]]], Any]) -> Any:
    bar = ProgressBar(label, enabled=False if quiet else None)
    try:
        return run(bar if bar.enabled else None)
    finally:
        bar.close()


def _cmd_export(args: argparse.Namespace) -> int:
    files = _with_progress(
        "export", args.quiet,
        lambda p: export_safetensors(args.checkpoint, args.out_dir, args.max_shard_size, prefix=args.prefix,
                                     verify=not args.no_verify, progress=p),
    )  # fmt: skip
    for f in files:
        print(f)
    return 0


def _cmd_import_safetensors(args: argparse.Namespace) -> int:
    summary = _with_progress(
        "import", args.quiet, lambda p: import_safetensors(args.sources, args.checkpoint, overwrite=args.overwrite,
                                                           progress=p)
    )  # fmt: skip
    print(f"{summary.path}: {summary.num_entries} entries, {_human(summary.total_bytes)}")
    return 0


def _cmd_import_dcp(args: argparse.Namespace) -> int:
    summary = _with_progress(
        "import", args.quiet,
        lambda p: import_torch_dcp(args.dcp_dir, args.checkpoint, overwrite=args.overwrite,
                                   allow_pickle=args.allow_pickle, progress=p),
    )  # fmt: skip
    print(f"{summary.path}: {summary.num_entries} entries, {_human(summary.total_bytes)}")
    return 0


def _cmd_consolidate(args: argparse.Namespace) -> int:
    summary = _with_progress(
        "consolidate", args.quiet,
        lambda p: consolidate(args.checkpoint, args.out, format=args.format, max_memory=args.max_memory,
                              overwrite=args.overwrite, allow_pickle=args.allow_pickle, verify=not args.no_verify,
                              progress=p),
    )  # fmt: skip
    print(f"{summary.path}: {summary.format}, {summary.num_tensors} tensors, {_human(summary.bytes)} "
          f"in {summary.seconds:.2f}s")  # fmt: skip
    if summary.skipped:
        shown = ", ".join(summary.skipped[:5]) + (f" and {len(summary.skipped) - 5} more" if len(summary.skipped) > 5
                                                   else "")  # fmt: skip
        print(f"left out {len(summary.skipped)} values that are not tensors (safetensors holds tensors only): {shown}",
              file=sys.stderr)  # fmt: skip
    return 0


def _cmd_import_torch(args: argparse.Namespace) -> int:
    summary = _with_progress(
        "import", args.quiet,
        lambda p: import_torch_save(args.file, args.checkpoint, overwrite=args.overwrite,
                                    weights_only=not args.unsafe_pickle, mmap=not args.no_mmap,
                                    allow_pickle=args.unsafe_pickle, progress=p),
    )  # fmt: skip
    print(f"{summary.path}: {summary.num_entries} entries, {_human(summary.total_bytes)}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    with open_checkpoint(args.checkpoint) as r:
        m = r.metadata
        print(f"{r.path}: format {m.format_version[0]}.{m.format_version[1]}, written by {m.writer}")
        print(f"{len(m)} entries, {_human(m.total_bytes)} in {m.num_files} data files")
        for k, v in sorted(m.user.items()):
            print(f"  user {k} = {v}")
        for name, e in m.items():
            if e.kind == "tensor":
                print(f"  {name}  {e.dtype}{list(e.shape)}  {e.num_chunks} chunk{'s' if e.num_chunks != 1 else ''}")
            else:
                print(f"  {name}  bytes[{e.nbytes}]")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m distckpt", description="distckpt checkpoint tools")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = sub.add_parser("export-safetensors", help="write a checkpoint's tensors as safetensors files + index")
    e.add_argument("checkpoint")
    e.add_argument("out_dir")
    e.add_argument("--max-shard-size", default="5GB", help="largest file, e.g. 5GB (default), 500MB, 4GiB")
    e.add_argument("--prefix", default="model", help="file name prefix (default: model)")
    e.add_argument("--no-verify", action="store_true", help="skip checksum verification while reading")
    e.set_defaults(run=_cmd_export)

    i = sub.add_parser("import-safetensors", help="save safetensors files as a checkpoint")
    i.add_argument("sources", nargs="+", metavar="SRC", help=".safetensors files, directories or index.json files")
    i.add_argument("checkpoint", help="the checkpoint directory to create")
    i.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    i.set_defaults(run=_cmd_import_safetensors)

    d = sub.add_parser("import-dcp", help="convert a torch.distributed.checkpoint directory (needs torch)")
    d.add_argument("dcp_dir")
    d.add_argument("checkpoint")
    d.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    d.add_argument("--allow-pickle", action="store_true", help="pickle values JSON cannot represent")
    d.set_defaults(run=_cmd_import_dcp)

    c = sub.add_parser("consolidate", help="write a checkpoint as one torch.save or safetensors file")
    c.add_argument("checkpoint")
    c.add_argument("out", help="the file to write (.pt, .pth, .bin: torch.save; .safetensors)")
    c.add_argument("--format", choices=("torch", "safetensors"), help="default: from OUT's suffix")
    c.add_argument("--max-memory", default="256MiB", help="copy buffers, e.g. 256MiB (default), 1GB (torch format)")
    c.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    c.add_argument("--allow-pickle", action="store_true", help="load pickled values (a checkpoint you trust)")
    c.add_argument("--no-verify", action="store_true", help="skip checksum verification while reading")
    c.set_defaults(run=_cmd_consolidate)

    t = sub.add_parser("import-torch", help="convert a torch.save file (a state dict) into a checkpoint")
    t.add_argument("file", help="a torch.save file")
    t.add_argument("checkpoint", help="the checkpoint directory to create")
    t.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    t.add_argument("--unsafe-pickle", action="store_true",
                   help="torch.load(weights_only=False) and pickle what JSON cannot hold (a file you trust)")
    t.add_argument("--no-mmap", action="store_true", help="read the file into memory instead of mapping it")
    t.set_defaults(run=_cmd_import_torch)

    n = sub.add_parser("info", help="list a checkpoint's entries")
    n.add_argument("checkpoint")
    n.set_defaults(run=_cmd_info)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except Error as e:
        print(f"distckpt: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
