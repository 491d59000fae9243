"""``python -m distckpt``: offline conversions that need Python libraries, and a quick look inside a checkpoint.

    python -m distckpt export-safetensors CKPT OUT_DIR [--max-shard-size 5GB] [--prefix model] [--rename P=R]...
        [--buffer-size 64MiB] [--io-threads N] [--json]
    python -m distckpt import-safetensors SRC [SRC ...] CKPT [--overwrite]
    python -m distckpt import-dcp DCP_DIR CKPT [--overwrite] [--allow-pickle]
    python -m distckpt consolidate CKPT OUT [--format torch|safetensors] [--max-memory 256MiB] [--overwrite] [--json]
    python -m distckpt import-torch FILE.pt CKPT [--overwrite] [--unsafe-pickle] [--no-mmap]
    python -m distckpt inspect CKPT [--layout NAME] [--json]      (also: info)

The Go CLI ``distckpt`` looks after stores (ls, verify, diff, du, prune) and shares inspect, export-safetensors and
consolidate with this one: the same names, flags, JSON documents and exit statuses, all defined in docs/cli.md.

Progress goes to stderr (``--progress auto|bar|log|none``; auto: a bar only on a terminal; ``-q``, ``--quiet`` and
``--no-progress`` mean none). Exit status (docs/cli.md), the Go CLI's table in every command: 0 success, 1 bad data
(a chunk failed its checksum, a data file is missing), 2 usage error, 3 another failure, 4 not found, 5 corrupt
metadata, 6 unsupported format version, 7 permission denied. (Before the statuses were shared every failure gave 1;
``--detailed-exit-status`` is still accepted and changes nothing.)
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import textwrap
import time
from typing import Any, Callable, Dict, List, Optional, TextIO, Tuple

from . import (CorruptCheckpointError, Error, InvalidArgumentError, NotFoundError, StorageError, VersionError,
               export_safetensors, import_safetensors, import_torch_dcp)  # fmt: skip
from . import _native
from . import open as open_checkpoint
from .consolidate import consolidate, import_torch_save
from .interop import parse_size

#: Exit statuses shared with the Go CLI (docs/cli.md; go/cmd/distckpt/main.go is the other copy).
EXIT_OK = 0
EXIT_BAD_DATA = 1  # a chunk failed its checksum or a data file is missing (while reading data)
EXIT_USAGE = 2
EXIT_FAILURE = 3  # failed for another reason
EXIT_NOT_FOUND = 4
EXIT_CORRUPT = 5  # corrupt metadata
EXIT_VERSION = 6
EXIT_PERMISSION = 7

#: The "schema_version" of every --json document (docs/cli.md says what bumps it).
JSON_SCHEMA_VERSION = 1


def _permission(err: BaseException) -> bool:
    if isinstance(err, PermissionError):
        return True
    # The C ABI has no permission code: the library reports EACCES/EPERM as an I/O error with strerror's text.
    return isinstance(err, StorageError) and ("Permission denied" in str(err) or "Operation not permitted" in str(err))


def exit_status(err: BaseException, reading_data: bool = False) -> int:
    """The Go CLI's exit status for a failure (docs/cli.md). ``reading_data``: the checkpoint's metadata opened and
    the failure came while reading its data, where a corrupt chunk or a missing data file is bad data (1)."""
    if _permission(err):
        return EXIT_PERMISSION
    if reading_data and isinstance(err, (CorruptCheckpointError, NotFoundError)):
        return EXIT_BAD_DATA
    if isinstance(err, (NotFoundError, FileNotFoundError, NotADirectoryError)):
        return EXIT_NOT_FOUND
    if isinstance(err, OSError) and err.errno in (errno.ENOENT, errno.ENOTDIR):
        return EXIT_NOT_FOUND
    if isinstance(err, CorruptCheckpointError):
        return EXIT_CORRUPT
    if isinstance(err, VersionError):
        return EXIT_VERSION
    return EXIT_FAILURE


def error_json(err: BaseException) -> Dict[str, str]:
    """The JSON form of an error, as the Go CLI writes it: the library's code name ("not found", "corrupt", ...)."""
    if isinstance(err, Error) and err.status:
        return {"code": err.status, "message": err.message}
    code = "error"
    status = exit_status(err)
    if status == EXIT_NOT_FOUND:
        code = "not found"
    elif status == EXIT_PERMISSION:
        code = "permission denied"
    return {"code": code, "message": str(err)}


class CommandFailed(Exception):
    """A failure with the exit status it gives under the shared table (raised by the commands, reported by main)."""

    def __init__(self, err: BaseException, status: int, path: str) -> None:
        super().__init__(str(err))
        self.err, self.status, self.path = err, status, path


def write_json(doc: Dict[str, Any], stream: Optional[TextIO] = None) -> None:
    """Prints one --json document with "schema_version" first, indented like the Go CLI's."""
    out = {"schema_version": JSON_SCHEMA_VERSION, **doc}
    print(json.dumps(out, indent=2, ensure_ascii=False), file=stream or sys.stdout)


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


class ProgressLog:
    """Plain progress lines for logs (--progress log), like the Go CLI's: the first report, then every 10% or 5 s with
    progress, and the end."""

    def __init__(self, label: str, stream: TextIO = sys.stderr) -> None:
        self.label, self.stream = label, stream
        self.enabled = True
        self._lines, self._last_pct, self._last_time, self._last_done, self._ended = 0, 0, 0.0, 0, False
        self._start = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        pct = int(done * 100 / total) if total else 100
        now = time.monotonic()
        end = done >= total
        if self._ended or not (self._lines == 0 or end or pct >= self._last_pct + 10 or
                               (now - self._last_time >= 5 and done > self._last_done)):  # fmt: skip
            return
        secs = now - self._start
        rate = f", {_human(done / secs)}/s" if secs > 0 and done > 0 else ""
        self.stream.write(f"{self.label}: {pct}% ({_human(done)} / {_human(total)}{rate})\n")
        self.stream.flush()
        self._lines += 1
        self._last_pct, self._last_time, self._last_done, self._ended = pct, now, done, end

    def close(self) -> None:
        pass


def _progress_mode(args: argparse.Namespace) -> str:
    if args.quiet or getattr(args, "sub_quiet", False) or getattr(args, "no_progress", False):
        return "none"
    return getattr(args, "progress", "auto")


def _with_progress(label: str, args: argparse.Namespace,
                   run: Callable[[Optional[Callable[[int, int], None]]], Any]) -> Any:  # fmt: skip
    mode = _progress_mode(args)
    bar: Any = (
        ProgressLog(label) if mode == "log" else ProgressBar(label, enabled={"none": False, "bar": True}.get(mode))
    )
    try:
        return run(bar if bar.enabled else None)
    finally:
        bar.close()


def _open_first(path: str) -> None:
    """Opens the checkpoint's metadata before a conversion, so that its failure (4 to 7) is told from bad data met
    while reading (1), as in the Go CLI."""
    try:
        open_checkpoint(path, verify=False).close()
    except (Error, OSError) as e:
        raise CommandFailed(e, exit_status(e), path) from e


def _reading(path: str, run: Callable[[], Any]) -> Any:
    """Runs a conversion that reads the data of checkpoint ``path``; a failure carries the shared exit status."""
    try:
        return run()
    except (Error, OSError) as e:
        raise CommandFailed(e, exit_status(e, reading_data=True), path) from e


def _cmd_export(args: argparse.Namespace) -> int:
    _open_first(args.checkpoint)
    start = time.monotonic()
    rename = [_rename_rule(r) for r in args.rename]
    try:
        files = _reading(args.checkpoint, lambda: _with_progress(
            "export", args,
            lambda p: export_safetensors(args.checkpoint, args.out_dir, args.max_shard_size, prefix=args.prefix,
                                         verify=not args.no_verify, progress=p, rename=rename,
                                         buffer_size=args.buffer_size, io_threads=args.io_threads),
        ))  # fmt: skip
    except CommandFailed as f:
        # A rule the core refuses (bad pattern, two tensors renamed to one name) is a bad flag value, as in the Go CLI.
        if rename and isinstance(f.err, InvalidArgumentError) and "rename" in str(f.err):
            print(f"distckpt export-safetensors: --rename: {f.err}", file=sys.stderr)
            return EXIT_USAGE
        raise
    seconds = time.monotonic() - start
    if args.json:
        index_name = args.prefix + ".safetensors.index.json"
        with open(os.path.join(args.out_dir, index_name), encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        names = sorted(set(weight_map.values()))
        files = [{"name": n, "bytes": os.path.getsize(os.path.join(args.out_dir, n))} for n in names]
        write_json({"checkpoint": args.checkpoint, "out": args.out_dir, "index": index_name,
                    "tensors": len(weight_map), "seconds": seconds, "files": files})  # fmt: skip
        return 0
    for f in files:
        print(f)
    return 0


def _rename_rule(text: str) -> Tuple[str, str]:
    """Splits "PATTERN=REPLACEMENT" at the first '=' (write a '=' inside a pattern as \\x3d)."""
    pattern, _, replacement = text.partition("=")
    return pattern, replacement


def _cmd_import_safetensors(args: argparse.Namespace) -> int:
    summary = _with_progress(
        "import", args, lambda p: import_safetensors(args.sources, args.checkpoint, overwrite=args.overwrite,
                                                           progress=p)
    )  # fmt: skip
    print(f"{summary.path}: {summary.num_entries} entries, {_human(summary.total_bytes)}")
    return 0


def _cmd_import_dcp(args: argparse.Namespace) -> int:
    summary = _with_progress(
        "import", args,
        lambda p: import_torch_dcp(args.dcp_dir, args.checkpoint, overwrite=args.overwrite,
                                   allow_pickle=args.allow_pickle, progress=p),
    )  # fmt: skip
    print(f"{summary.path}: {summary.num_entries} entries, {_human(summary.total_bytes)}")
    return 0


def _cmd_consolidate(args: argparse.Namespace) -> int:
    _open_first(args.checkpoint)
    summary = _reading(args.checkpoint, lambda: _with_progress(
        "consolidate", args,
        lambda p: consolidate(args.checkpoint, args.out, format=args.format, max_memory=args.max_memory,
                              overwrite=args.overwrite, allow_pickle=args.allow_pickle, verify=not args.no_verify,
                              progress=p),
    ))  # fmt: skip
    if args.json:
        write_json({"checkpoint": args.checkpoint, "out": args.out, "format": summary.format,
                    "tensors": summary.num_tensors, "skipped": list(summary.skipped),
                    "bytes": os.path.getsize(args.out), "seconds": summary.seconds})  # fmt: skip
        return 0
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
        "import", args,
        lambda p: import_torch_save(args.file, args.checkpoint, overwrite=args.overwrite,
                                    weights_only=not args.unsafe_pickle, mmap=not args.no_mmap,
                                    allow_pickle=args.unsafe_pickle, progress=p),
    )  # fmt: skip
    print(f"{summary.path}: {summary.num_entries} entries, {_human(summary.total_bytes)}")
    return 0


#: The formats both CLIs read, for their --help (docs/cli.md): distckpt's own, and those read in place. Wrapped here,
#: not by argparse, which would break "models--ORG--NAME" at its hyphens.
FORMATS_HELP = textwrap.fill(
    "CKPT is a distckpt checkpoint, or a checkpoint another library wrote, read in place (docs/foreign.md): a "
    "Hugging Face safetensors directory (an index and its shards, or .safetensors files), one .safetensors file or "
    "*.safetensors.index.json, a Hugging Face hub cache snapshot (models--ORG--NAME/snapshots/REV) or repository "
    "(models--ORG--NAME: its refs/main), or a PyTorch DCP directory (.metadata and .distcp files).",
    width=100,
    break_on_hyphens=False,
)

#: User values longer than this are cut in inspect's text output (--json has them whole).
LONG_VALUE = 100


def summarise(value: str) -> str:
    """A user value as inspect's text shows it: whole if short, else its start and its size (the Go CLI's rule)."""
    if len(value) <= LONG_VALUE:
        return value
    return f"{value[:LONG_VALUE]}… ({len(value.encode())} bytes; --json for all)"


def format_version(m: Any) -> Optional[str]:
    """inspect's "format_version": distckpt's MAJOR.MINOR, or the version a foreign format records (None if none)."""
    if m.format == "distckpt":
        return f"{m.format_version[0]}.{m.format_version[1]}"
    return m.source_version


def inspect_json(r: Any, path: str, layout: Optional[str] = None) -> Dict[str, Any]:
    """The document of ``inspect --json`` (docs/cli.md), from an open reader: the Go CLI prints the same one."""
    m = r.metadata
    own = m.format == "distckpt"  # format_major/minor are distckpt's format version: a foreign format has none

    def entry(e: Any) -> Dict[str, Any]:
        tensor = e.kind == "tensor"
        return {"name": e.name, "kind": e.kind, "dtype": e.dtype if tensor else None,
                "shape": list(e.shape) if tensor else None, "bytes": e.nbytes, "chunks": e.num_chunks}  # fmt: skip

    doc: Dict[str, Any] = {
        "path": path, "format": m.format, "format_version": format_version(m),
        "format_major": m.format_version[0] if own else None, "format_minor": m.format_version[1] if own else None,
        "writer": m.writer,
        "num_entries": len(m), "num_files": m.num_files, "total_bytes": m.total_bytes,
        "metadata_bytes": m.metadata_bytes, "checksum_block_size": m.checksum_block_size, "bases": list(m.bases),
        "chain_length": m.chain_length, "bytes_in_bases": m.bytes_in_bases, "stored_bytes": m.stored_bytes,
        "compressed_chunks": m.compressed_chunks, "user": dict(m.user),
        "entries": [entry(e) for e in m.values()], "layout": None,
    }  # fmt: skip
    if layout is not None:
        e = _layout_entry(r, path, layout)
        doc["layout"] = {"name": e.name, "chunks": [
            {"index": i, "offsets": list(c.offsets), "lengths": list(c.lengths), "file": c.file,
             "file_offset": c.file_offset, "length": c.length, "checksum": f"{c.checksum:016x}", "base": c.base,
             "codec": c.codec, "stored_length": c.stored_length}
            for i, c in enumerate(e.chunks)]}  # fmt: skip
    return doc


def _layout_entry(r: Any, path: str, name: str) -> Any:
    try:
        return r.metadata[name]
    except KeyError:
        raise NotFoundError(f"checkpoint '{path}' has no entry '{name}'", status="not found") from None


def _cmd_inspect(args: argparse.Namespace) -> int:
    try:
        with open_checkpoint(args.checkpoint, verify=False) as r:
            laid = _layout_entry(r, args.checkpoint, args.layout) if args.layout is not None else None
            if args.json:
                write_json(inspect_json(r, args.checkpoint, args.layout))
                return 0
            m = r.metadata
            if m.format == "distckpt":
                print(f"{r.path}: format {format_version(m)}, written by {m.writer}")
            else:
                version = f" {m.source_version}" if m.source_version else ""
                print(f"{r.path}: format {m.format}{version} (written by another library, read in place; "
                      "no checksums)")  # fmt: skip
            print(f"{len(m)} entries, {_human(m.total_bytes)} in {m.num_files} data files")
            if m.compressed_chunks:
                print(f"compressed: {m.compressed_chunks} chunks; {_human(m.stored_bytes)} stored "
                      f"({m.stored_bytes / max(1, m.total_bytes):.2f} of the data)")  # fmt: skip
            if m.bases:
                print(f"bases: {', '.join(m.bases)} (incremental: {_human(m.bytes_in_bases)} of the data lies there; "
                      f"{m.chain_length} saves since the last self-contained one)")  # fmt: skip
            for k, v in sorted(m.user.items()):
                print(f"  user {k} = {summarise(v)}")
            for name, e in m.items():
                if e.kind == "tensor":
                    print(f"  {name}  {e.dtype}{list(e.shape)}  {e.num_chunks} chunk{'s' if e.num_chunks != 1 else ''}")
                else:
                    print(f"  {name}  bytes[{e.nbytes}]")
            if laid is not None:
                print(f"layout of {laid.name}:")
                for i, c in enumerate(laid.chunks):
                    box = ", ".join(f"{o}:{o + n}" for o, n in zip(c.offsets, c.lengths))
                    file = f"../{c.base}/{c.file}" if c.base else c.file
                    stored = f"  zstd, {c.stored_length} B stored" if c.codec != "none" else ""
                    print(f"  chunk {i}  [{box}]  {file} @ {c.file_offset}  {c.length} B  {c.checksum:016x}{stored}")
    except (Error, OSError) as e:
        raise CommandFailed(e, exit_status(e), args.checkpoint) from e
    return 0


def _cmd_tiers(args: argparse.Namespace) -> int:
    """A manager's local tier, from the core's document (the Go CLI prints the same)."""
    if args.dry_run and not args.prune_abandoned:
        raise CommandFailed(InvalidArgumentError("--dry-run goes with --prune-abandoned"), 2, args.dir)
    if args.prune_abandoned:
        removed = _native.tiers_prune_abandoned(args.dir, args.dry_run)
        if args.json:
            write_json({"dir": args.dir, "dry_run": bool(args.dry_run), "removed": removed})
        else:
            for p in removed:
                print(f"{'would remove' if args.dry_run else 'removed'} {p}")
            if not removed:
                print(f"nothing abandoned in {args.dir}")
        return 0
    doc = json.loads(_native.tiers_describe(args.dir))
    if args.json:
        write_json(doc)
        return 0
    print(_tiers_text(doc), end="")
    return 0


def _tiers_text(doc: Dict[str, Any]) -> str:
    """The Go CLI's table of a tier document, character for character (its humanBytes sizes, tabwriter columns)."""
    out = []
    if not doc["steps"]:
        out.append(f"no steps in the tier {doc['dir']}")
    for s in doc["steps"]:
        notes = ["complete" if s["complete"] else "not complete"]
        if s["restorable_here"]:
            notes.append(f"restorable from this node alone (run {s['restorable_run']})")
        if s["abandoned"]:
            notes.append("abandoned")
        out.append(f"step {s['step']}: {', '.join(notes)}")
        rows = [("  PART", "RANK", "OF", "KIND", "SIZE", "STATE", "RUN")]
        for p in s["parts"]:
            state = p["state"] + (f": {p['why']}" if p["why"] else "")
            kind = "-" if p.get("replica") is None else ("copy" if p["replica"] else "own")
            rows.append(("  " + p["name"], "-" if p["rank"] is None else str(p["rank"]), str(p["ranks"] or "-"), kind,
                         _iec_bytes(p["bytes"]), state, p["run"]))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        out += ["".join(c.ljust(w + 2) for c, w in zip(r, widths)) + r[-1] for r in rows]
    if doc["other"]:
        out.append(f"not the manager's (left alone): {', '.join(doc['other'])}")
    return "".join(line + "\n" for line in out)


def _iec_bytes(n: int) -> str:
    """Sizes as the Go CLI's humanBytes writes them: "512 B", "4.4 KiB"."""
    if n < 1024:
        return f"{n} B"
    div, exp, m = 1024, 0, n // 1024
    while m >= 1024 and exp < 5:
        div, exp, m = div * 1024, exp + 1, m // 1024
    return f"{n / div:.1f} {'KMGTPE'[exp]}iB"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m distckpt", epilog=FORMATS_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="distckpt checkpoint tools: conversions that "
                                "need Python; the Go CLI distckpt looks after stores (docs/cli.md)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no progress report (--progress none)")
    p.add_argument(
        "--detailed-exit-status",
        action="store_true",
        help="accepted and ignored: the Go CLI's exit statuses (docs/cli.md) are the default now",
    )

    # Flags the commands share with the Go CLI (docs/cli.md).
    progress = argparse.ArgumentParser(add_help=False)
    progress.add_argument("--progress", choices=("auto", "bar", "log", "none"), default="auto",
                          help="progress on stderr (auto: a bar on a terminal, nothing otherwise; log: a plain line "
                               "every 10%% or 5s)")  # fmt: skip
    progress.add_argument("--no-progress", action="store_true", help="same as --progress none")
    progress.add_argument("--quiet", dest="sub_quiet", action="store_true", help="same as --progress none")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print one JSON document on stdout (docs/cli.md)")

    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = sub.add_parser(
        "export-safetensors",
        parents=[progress, as_json],
        help="write a checkpoint's tensors as safetensors files + index",
    )
    e.add_argument("checkpoint")
    e.add_argument("out_dir")
    e.add_argument("--max-shard-size", default="5GB", help="largest file, e.g. 5GB (default), 500MB, 4GiB")
    e.add_argument("--prefix", default="model", help="file name prefix (default: model)")
    e.add_argument("--no-verify", action="store_true", help="skip checksum verification while reading")
    e.add_argument(
        "--rename",
        action="append",
        default=[],
        metavar="PATTERN=REPLACEMENT",
        help="rename tensors (repeatable, first match wins; split at the first '='): PATTERN an ECMAScript "
        "regex matching the whole name, REPLACEMENT with \\1 or \\g<N> for groups; an empty "
        "REPLACEMENT leaves the tensors out (capi/API.md, 'Export to the Hugging Face hub')",
    )
    e.add_argument("--buffer-size", default=None, help="tensor bytes held in memory at once (default 64MiB)")
    e.add_argument("--io-threads", type=int, default=0, help="files written at once (default 1)")
    e.set_defaults(run=_cmd_export)

    i = sub.add_parser("import-safetensors", parents=[progress], help="save safetensors files as a checkpoint")
    i.add_argument("sources", nargs="+", metavar="SRC", help=".safetensors files, directories or index.json files")
    i.add_argument("checkpoint", help="the checkpoint directory to create")
    i.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    i.set_defaults(run=_cmd_import_safetensors)

    d = sub.add_parser(
        "import-dcp", parents=[progress], help="convert a torch.distributed.checkpoint directory (needs torch)"
    )
    d.add_argument("dcp_dir")
    d.add_argument("checkpoint")
    d.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    d.add_argument("--allow-pickle", action="store_true", help="pickle values JSON cannot represent")
    d.set_defaults(run=_cmd_import_dcp)

    c = sub.add_parser(
        "consolidate", parents=[progress, as_json], help="write a checkpoint as one torch.save or safetensors file"
    )
    c.add_argument("checkpoint")
    c.add_argument("out", help="the file to write (.pt, .pth, .bin: torch.save; .safetensors)")
    c.add_argument("--format", choices=("torch", "safetensors"), help="default: from OUT's suffix")
    c.add_argument("--max-memory", default="256MiB", help="copy buffers, e.g. 256MiB (default), 1GB (torch format)")
    c.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    c.add_argument("--allow-pickle", action="store_true", help="load pickled values (a checkpoint you trust)")
    c.add_argument("--no-verify", action="store_true", help="skip checksum verification while reading")
    c.set_defaults(run=_cmd_consolidate)

    t = sub.add_parser(
        "import-torch", parents=[progress], help="convert a torch.save file (a state dict) into a checkpoint"
    )
    t.add_argument("file", help="a torch.save file")
    t.add_argument("checkpoint", help="the checkpoint directory to create")
    t.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    t.add_argument(
        "--unsafe-pickle",
        action="store_true",
        help="torch.load(weights_only=False) and pickle what JSON cannot hold (a file you trust)",
    )
    t.add_argument("--no-mmap", action="store_true", help="read the file into memory instead of mapping it")
    t.set_defaults(run=_cmd_import_torch)

    tiers = sub.add_parser(
        "tiers",
        parents=[as_json],
        help="what a checkpoint manager's node-local tier holds: steps, parts, replicas, what restores from here",
    )
    tiers.add_argument("dir", help="a CheckpointManager's local_dir on this node")
    tiers.add_argument("--prune-abandoned", action="store_true",
                       help="remove abandoned staging directories and abandoned steps")  # fmt: skip
    tiers.add_argument("--dry-run", action="store_true", help="with --prune-abandoned: remove nothing, say what")
    tiers.set_defaults(run=_cmd_tiers)

    # inspect is the Go CLI's name; info is the older one.
    for name, text in (("inspect", "list a checkpoint's entries and user metadata (also: info)"),
                       ("info", "the same as inspect (older name)")):  # fmt: skip
        n = sub.add_parser(
            name,
            parents=[as_json],
            help=text,
            description=FORMATS_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        n.add_argument("checkpoint")
        n.add_argument("--layout", metavar="NAME", help="also show the chunk layout of entry NAME")
        n.set_defaults(run=_cmd_inspect)
    return p


def _check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Bad flag values are usage errors (exit status 2), as in the Go CLI, not failures of the command."""
    for flag in ("max_shard_size", "max_memory", "buffer_size"):
        value = getattr(args, flag, None)
        if value is not None:
            try:
                parse_size(value)
            except Error as e:
                parser.error(f"--{flag.replace('_', '-')}: {e}")
    for rule in getattr(args, "rename", None) or []:
        if "=" not in rule:
            parser.error(f"--rename {rule!r}: expected PATTERN=REPLACEMENT (an empty REPLACEMENT drops the tensors)")
    if getattr(args, "io_threads", 0) < 0:
        parser.error("--io-threads must be >= 0")
    prefix = getattr(args, "prefix", None)
    if prefix is not None and (not prefix or os.path.basename(prefix) != prefix):
        parser.error("--prefix must be a plain file name prefix")


def main(argv: Optional[List[str]] = None) -> int:
    """The whole CLI: parses argv, runs one command, returns the exit status (docs/cli.md)."""
    parser = _parser()
    args = parser.parse_args(argv)
    _check_flags(parser, args)
    try:
        return int(args.run(args))
    except CommandFailed as f:
        err, status, path = f.err, f.status, f.path
    except (Error, OSError) as e:
        err, status, path = e, exit_status(e), ""
    je = error_json(err)
    msg = str(err)
    if path and path not in msg and os.path.normpath(path) not in msg:
        msg = f"{path}: {msg}"
        je["message"] = f"{path}: {je['message']}"
    print(f"distckpt: error: {msg}", file=sys.stderr)
    if getattr(args, "json", False):
        write_json({"error": je})
    return status


if __name__ == "__main__":
    sys.exit(main())
