"""Writes bench/results/<date>-<host>.md (tables, ratios, targets) and the PNG bar chart from a driver.Bench run."""

import datetime
import os

GB = 1e9
MiB = 1 << 20


def _fmt(st, scale, unit, digits=2):
    if st is None:
        return "n/a"
    med, lo, hi, n = st
    f = "%%.%df" % digits
    return ("**" + f + "** %s (" + f + "–" + f + ")") % (med * scale, unit, lo * scale, hi * scale)


def write(b, date=None):
    date = date or datetime.date.today().isoformat()
    host = b.machine_info["host"]
    os.makedirs(b.args.out, exist_ok=True)
    stem = "%s-%s%s" % (date, host, "-quick" if b.args.quick_mode else "")
    md_path = os.path.join(b.args.out, stem + ".md")
    png_path = os.path.join(b.args.out, stem + ".png")
    S = b.stat

    def med(key):
        s = S(key)
        return s[0] if s else None

    def ratio(x, y):
        return x / y if x is not None and y not in (None, 0) else None

    def gbps(key):
        return _fmt(S(key), 1 / GB, "GB/s")

    def secs(key, scale=1.0, unit="s", digits=3):
        return _fmt(S(key), scale, unit, digits)

    L = []
    L.append("# distckpt benchmarks: %s on %s%s" % (date, host, " (--quick: sizes too small to judge)"
                                                     if b.args.quick_mode else ""))
    L.append("")
    L.append("Produced by `bench/run%s` in %.0f minutes. Each figure: **median** (min–max) of %d runs; within a run the "
             "systems take turns in a rotating order. GB = 10^9 bytes. Throughput = bytes of the state (logical, "
             "replicas counted once) / wall time of the slowest rank, timed from a barrier." %
             (" --quick" if b.args.quick_mode else "", b.elapsed / 60, b.args.runs))
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append("| what | value |")
    L.append("|---|---|")
    m = b.machine_info
    for k in ("host", "cpu", "cores", "memory", "kernel", "filesystem", "disk_free", "fio", "torch", "cold_cache"):
        L.append("| %s | %s |" % (k if k != "torch" else "torch, safetensors", m.get(k)))
    L.append("| memcpy, one thread | %s |" % gbps("memcpy_1t"))
    L.append("| memcpy, %d threads | %s |" % (m["cores"], gbps("memcpy_all")))
    L.append("| XXH3 of 1 MiB blocks, %d threads (from memory) | %s |" % (m["cores"], gbps("hash_all")))
    L.append("| verified copy: XXH3 of each 1 MiB block, then memcpy of it while cached, %d threads | %s |" % (
        m["cores"], gbps("hash_copy_all")))
    L.append("| fio seq write, %d jobs/files, 1 MiB, fsync at end (fsync included) | %s |" %
             (b.args.save_ranks, gbps("fio_write_fsync")))
    L.append("| fio seq write as fio reports it (end_fsync not counted) | %s |" % gbps("fio_write_nofsync_reported"))
    L.append("| fio seq write, O_DIRECT, io_uring 16 deep per job, fsync at end (fsync included) | %s |" %
             gbps("fio_write_direct_qd16"))
    L.append("| fio seq read, buffered, cold cache, %d jobs, 1 MiB psync | %s |" % (b.args.save_ranks,
                                                                                 gbps("fio_read_buffered")))
    L.append("| fio seq read, O_DIRECT, %d jobs, 1 MiB psync | %s |" % (b.args.save_ranks, gbps("fio_read_direct")))
    L.append("| fio seq read, O_DIRECT, io_uring 16 deep per job | %s |" % gbps("fio_read_direct_qd16"))
    L.append("")
    L.append("State: %d tensors (bf16 weights + fp32 Adam moments), %.2f GiB, %.0f%% of the bytes replicated on every "
             "saving rank; saved by %d ranks (rows), loaded by %d ranks (sharded tensors by columns, replicated ones "
             "by rows). Every distckpt load checks every value it loaded (outside the timing); checksums are verified "
             "on load (the default) unless noted." % (b.num_tensors, b.total_bytes / (1 << 30),
                                                      100 * b.replicated_share, b.args.save_ranks, b.args.load_ranks))
    L.append("")

    L.append("## Results")
    L.append("")
    L.append("| scenario | distckpt | DCP thread_count=1 | DCP thread_count=4 | safetensors (1 process) | physical "
             "limit | distckpt / limit | distckpt / best DCP |")
    L.append("|---|---|---|---|---|---|---|---|")
    # The faster safetensors backend in (g), cold and warm.
    st_cold = min(filter(None, [med("model_st_mmap_cold"), med("model_st_pread_cold")]), default=None)
    st_warm = min(filter(None, [med("model_st_mmap_warm"), med("model_st_pread_warm")]), default=None)
    best_dcp_save = max(filter(None, [med("dcp1_save"), med("dcp4_save")]), default=None)
    # The physical limits the targets use: the best fio figure of each direction, whatever its I/O path.
    fio_read = max(filter(None, [med("fio_read_buffered"), med("fio_read_direct"), med("fio_read_direct_qd16")]),
                   default=None)
    fio_write = max(filter(None, [med("fio_write_fsync"), med("fio_write_direct_qd16")]), default=None)

    def r(x):
        return "%.2f×" % x if x is not None else "n/a"

    L.append("| (a) durable save, %d ranks | %s | %s | %s | %s | best fio write+fsync %s | %s | %s |" % (
        b.args.save_ranks, gbps("dckpt_save"), gbps("dcp1_save"), gbps("dcp4_save"), gbps("st_save"),
        _fmt((fio_write, fio_write, fio_write, 1) if fio_write else None, 1 / GB, "GB/s"),
        r(ratio(med("dckpt_save"), fio_write)), r(ratio(med("dckpt_save"), best_dcp_save))))
    L.append("| (a) durable save, buffers not page-aligned | %s | | | | | %s | %s |" % (
        gbps("dckpt_save_unaligned"), r(ratio(med("dckpt_save_unaligned"), fio_write)),
        r(ratio(med("dckpt_save_unaligned"), best_dcp_save))))
    L.append("| (b) resharded load %d→%d, cold cache | %s | | %s | %s (not resharded) | fio read %s | %s | %s |" % (
        b.args.save_ranks, b.args.load_ranks, gbps("dckpt_load_cold"), gbps("dcp_load_cold"), gbps("st_load_cold"),
        _fmt((fio_read, fio_read, fio_read, 1) if fio_read else None, 1 / GB, "GB/s"),
        r(ratio(med("dckpt_load_cold"), fio_read)), r(ratio(med("dckpt_load_cold"), med("dcp_load_cold")))))
    L.append("| (b) resharded load, warm cache | %s | | %s | %s (lazy mmap) | memcpy %s | %s | %s |" % (
        gbps("dckpt_load_warm"), gbps("dcp_load_warm"), gbps("st_load_warm"), gbps("memcpy_all"),
        r(ratio(med("dckpt_load_warm"), med("memcpy_all"))), r(ratio(med("dckpt_load_warm"), med("dcp_load_warm")))))
    L.append("| (b) warm, against the verified-copy limit (hash + copy of every byte) | %s | | | | verified copy %s | %s | |" % (
        gbps("dckpt_load_warm"), gbps("hash_copy_all"), r(ratio(med("dckpt_load_warm"), med("hash_copy_all")))))
    least = max(filter(None, [med("reshard_least_map"), med("reshard_least_read")]), default=None)
    L.append("| (b) warm, against the least work of this reshard through the page cache (best of mapped / pread; "
             "each block hashed once, each rank's bytes copied once) | %s | | | | least work %s (mapped %s, pread %s) "
             "| %s | |" % (gbps("dckpt_load_warm"), "%.2f GB/s" % (least / GB) if least else "n/a",
                           gbps("reshard_least_map"), gbps("reshard_least_read"),
                           r(ratio(med("dckpt_load_warm"), least))))
    L.append("| (b) warm, the same least work from private copies of the files (no page cache) | %s | | | | "
             "verified copy %s | %s | |" % (gbps("reshard_least_private"), gbps("hash_copy_all"),
                                           r(ratio(med("reshard_least_private"), med("hash_copy_all")))))
    L.append("| (b) warm, checksums not verified | %s | | | | memcpy %s | %s | |" % (
        gbps("dckpt_load_warm_noverify"), gbps("memcpy_all"),
        r(ratio(med("dckpt_load_warm_noverify"), med("memcpy_all")))))
    L.append("| (c) async save, steady state (2nd save; DCP with one DefaultStager reused, which caches its staged copy): stall until control "
             "returns | %s | | %s | | memcpy of each rank's state into faulted-in buffers %s | %s | %s |" % (
                 secs("dckpt_async_stall"), secs("dcp_async_stall"), secs("memcpy_state_prefaulted"),
                 r(ratio(med("dckpt_async_stall"), med("memcpy_state_prefaulted"))),
                 r(ratio(med("dckpt_async_stall"), med("dcp_async_stall")))))
    L.append("| (c) async save, steady state: total | %s | | %s | | | | %s |" % (
        secs("dckpt_async_total"), secs("dcp_async_total"), r(ratio(med("dckpt_async_total"), med("dcp_async_total")))))
    L.append("| (c) async save, first save (fresh staging memory): stall | %s | | %s | | memcpy into fresh buffers %s "
             "| %s | %s |" % (secs("dckpt_async_first_stall"), secs("dcp_async_first_stall"),
                              secs("memcpy_state_fresh"),
                              r(ratio(med("dckpt_async_first_stall"), med("memcpy_state_fresh"))),
                              r(ratio(med("dckpt_async_first_stall"), med("dcp_async_first_stall")))))
    L.append("| (c) async save, first save: total | %s | | %s | | | | %s |" % (
        secs("dckpt_async_first_total"), secs("dcp_async_first_total"),
        r(ratio(med("dckpt_async_first_total"), med("dcp_async_first_total")))))
    ex = b.extra
    if "dckpt_plan_median" in ex:
        L.append("| (d) global plan, %s chunks | **%.3f s** (best %.3f) | %s | | | | | %s |" % (
            "{:,}".format(ex.get("dckpt_chunks", 0)), ex["dckpt_plan_median"], ex["dckpt_plan_best"],
            "%.2f s (%s chunks)" % (ex["dcp_plan"], "{:,}".format(ex["dcp_chunks"])) if "dcp_plan" in ex else "n/a",
            r(ratio(ex.get("dcp_plan"), ex["dckpt_plan_median"])) + " faster" if "dcp_plan" in ex else ""))
        L.append("| (d) metadata on disk | %.1f MiB (%.0f B/chunk) | %s | | | | | |" % (
            ex["dckpt_meta_bytes"] / MiB, ex["dckpt_meta_bytes"] / max(1, ex.get("dckpt_chunks", 1)),
            "%.1f MiB pickle (%.0f B/chunk)" % (ex["dcp_meta_bytes"] / MiB, ex["dcp_meta_bytes"] / ex["dcp_chunks"])
            if "dcp_meta_bytes" in ex else "n/a"))
        L.append("| (d) open metadata + look up one tensor (fresh process) | %s | %s (pickle.load + dict lookup) "
                 "| | | | | %s |" % (secs("dckpt_open_lookup", 1e3, "ms", 1), secs("dcp_open_lookup", 1e3, "ms", 1),
                                       r(ratio(med("dcp_open_lookup"), med("dckpt_open_lookup"))) + " faster"
                                       if med("dcp_open_lookup") else ""))
    L.append("| (e) peak RSS over the state, save (max over ranks) | %s | %s | %s | | | | |" % (
        secs("rss_over_dckpt_save", 1 / MiB, "MiB", 0), secs("rss_over_dcp1_save", 1 / MiB, "MiB", 0),
        secs("rss_over_dcp4_save", 1 / MiB, "MiB", 0)))
    L.append("| (e) peak RSS over the state, load | %s | | %s | | | | |" % (
        secs("rss_over_dckpt_load", 1 / MiB, "MiB", 0), secs("rss_over_dcp_load", 1 / MiB, "MiB", 0)))
    L.append("| (e) peak RSS over the state, async save (includes the staged copy) | %s | | | | | | |" %
             secs("rss_over_dckpt_async", 1 / MiB, "MiB", 0))
    L.append("| (f) time to first tensor, %d GiB, cold | %s (Rust view()) | | | %s (safe_open + get_tensor) | | | "
             "%s |" % (b.args.view_gib, secs("view_first_cold", 1e3, "ms", 2), secs("st_first_cold", 1e3, "ms", 2),
                       r(ratio(med("st_first_cold"), med("view_first_cold"))) + " faster"
                       if med("view_first_cold") else ""))
    L.append("| (f) time to first tensor, warm | %s | | | %s | | | %s |" % (
        secs("view_first_warm", 1e3, "ms", 3), secs("st_first_warm", 1e3, "ms", 3),
        r(ratio(med("st_first_warm"), med("view_first_warm"))) + " faster" if med("view_first_warm") else ""))
    L.append("| (f) full read (every element summed), cold | %s | | | %s | | | |" % (
        secs("view_full_cold", 1e3, "ms", 0), secs("st_full_cold", 1e3, "ms", 0)))
    L.append("| (f) full read, warm | %s | | | %s | | | |" % (
        secs("view_full_warm", 1e3, "ms", 0), secs("st_full_warm", 1e3, "ms", 0)))
    L.append("")
    if S("model_map_all_cold") or S("model_st_mmap_cold"):
        mb = b.extra.get("model_bytes", 0)
        fio_model = max(filter(None, [med("model_fio_buffered"), med("model_fio_direct"),
                                      med("model_fio_direct_qd16")]), default=None)
        L.append("### (g) whole-model load, one process (inference server start-up)")
        L.append("")
        L.append("%d bf16 tensors (embedding, %s layers of q/k/v/o, gate/up/down and norms, lm_head), %.2f GiB, saved "
                 "by one process; the same tensors in one .safetensors file written by distckpt's exporter. Time from "
                 "open until every tensor is usable, with one byte of every 4 KiB page of every tensor read after the "
                 "load (what makes a lazily mapped tensor resident; the sum of those bytes is checked against the "
                 "model on every run). distckpt verifies every checksum; safetensors has none to verify. Cold = "
                 "page cache dropped before each load." % (
                     b.extra.get("model_tensors", 0), (b.extra.get("model_tensors", 3) - 3) // 9, mb / (1 << 30)))
        L.append("")
        L.append("| load | cold | warm | cold GB/s | cold / best fio read | vs best safetensors, cold | warm |")
        L.append("|---|---|---|---|---|---|---|")
        for key, what in (("map_all", "distckpt Rust `map_all()`: zero-copy views, verified in place"),
                          ("read_all", "distckpt Rust `read_all()`: verified copies into page-aligned buffers"),
                          ("st_mmap", "safetensors `load_file` (mmap backend, the default)"),
                          ("st_pread", "safetensors `load_file(backend=\"pread\")`")):
            c, w = med("model_%s_cold" % key), med("model_%s_warm" % key)
            L.append("| %s | %s | %s | %s | %s | %s× | %s× |" % (
                what, secs("model_%s_cold" % key), secs("model_%s_warm" % key),
                "%.2f" % (mb / c / GB) if c else "n/a", r(ratio(mb / c if c else None, fio_model)),
                "%.2f" % (c / st_cold) if c and st_cold else "n/a", "%.2f" % (w / st_warm) if w and st_warm else "n/a"))
        L.append("| fio sequential read of the data file, 1 MiB: buffered / O_DIRECT / O_DIRECT io_uring 16 deep | "
                 "%s / %s / %s | | | | | |" % (gbps("model_fio_buffered"), gbps("model_fio_direct"),
                                              gbps("model_fio_direct_qd16")))
        L.append("")
    L.append("distckpt wrote %s data bytes + %s bytes of metadata; DCP's checkpoint is %s bytes on disk. On load, the "
             "%d distckpt ranks of the cold load read %s bytes from the data files with pread in all; the rest of what "
             "they needed was already in the page cache (another rank had read it) and came through a mapping of the "
             "file. Column slices need whole 1 MiB checksum blocks, i.e. whole rows; each shared block is hashed by "
             "one rank of the host." % ("{:,}".format(getattr(b, "ckpt_bytes", None) or 0), "{:,}".format(ex.get("dckpt_metadata_bytes", 0)),
                            "{:,}".format(ex.get("dcp_bytes_on_disk", 0)), b.args.load_ranks,
                            "{:,}".format(int(ex.get("dckpt_load_bytes_read", 0)))))
    L.append("")

    # ---- targets ----
    T = []

    def target(name, value, ok, reason=""):
        T.append((name, value, "n/a" if ok is None else ("**met**" if ok else "**not met**"), reason))

    def check(x, op, y):
        if x is None or y is None:
            return None
        return x >= y if op == ">=" else x <= y if op == "<=" else x < y

    x = ratio(med("dckpt_save"), fio_write)
    target("(a) save ≥ 0.9 × fio write+fsync (the better of buffered psync and O_DIRECT io_uring)", r(x),
           check(x, ">=", 0.9))
    x = ratio(med("dckpt_save"), best_dcp_save)
    target("(a) save ≥ 3 × DCP at its best thread_count", r(x), check(x, ">=", 3))
    x = ratio(med("dckpt_load_cold"), fio_read)
    target("(b) cold resharded load ≥ 0.9 × fio read (the best of buffered, direct, direct io_uring)", r(x),
           check(x, ">=", 0.9))
    x = ratio(med("dckpt_load_warm"), med("memcpy_all"))
    target("(b) warm load ≥ 0.8 × memcpy", r(x), check(x, ">=", 0.8))
    x = ratio(med("dckpt_load_cold"), med("dcp_load_cold"))
    target("(b) cold load ≥ 5 × DCP", r(x), check(x, ">=", 5))
    x = ratio(med("dckpt_load_warm"), med("dcp_load_warm"))
    target("(b) warm load ≥ 5 × DCP", r(x), check(x, ">=", 5))
    x = ratio(med("dckpt_async_stall"), med("memcpy_state_prefaulted"))
    target("(c) async stall ≤ 1.2 × memcpy of the state, steady state (into faulted-in memory)", r(x),
           check(x, "<=", 1.2))
    x = ratio(med("dckpt_async_first_stall"), med("memcpy_state_fresh"))
    target("(c) async stall ≤ 1.2 × memcpy of the state, first save (into fresh memory)", r(x), check(x, "<=", 1.2))
    x = ratio(med("dckpt_async_stall"), med("dcp_async_stall"))
    target("(c) async stall below DCP's, steady state", r(x), check(x, "<", 1.0))
    x = ratio(med("dckpt_async_first_stall"), med("dcp_async_first_stall"))
    target("(c) async stall below DCP's, first save", r(x), check(x, "<", 1.0))
    p = ex.get("dckpt_plan_median")
    target("(d) global plan ≤ 1 s at ~1M chunks", "%.3f s" % p if p else "n/a", check(p, "<=", 1.0))
    x = med("dckpt_open_lookup")
    target("(d) open + lookup ≤ 50 ms", "%.1f ms" % (x * 1e3) if x else "n/a", check(x, "<=", 0.050))
    pool = b.args.io_pool_bytes
    for key, allowance, what in (("rss_over_dckpt_save", 64 * MiB, "save (no staging pool)"),
                                 ("rss_over_dckpt_load", 64 * MiB + pool, "load (+ read bounce pool %d MiB)" %
                                  (pool // MiB)),
                                 ("rss_over_dckpt_async", 64 * MiB + ex.get("dckpt_state_per_rank_async", 0),
                                  "async save (+ staging pool = the rank's state, %d MiB)" %
                                  (ex.get("dckpt_state_per_rank_async", 0) // MiB))):
        x = med(key)
        target("(e) RSS overhead ≤ %d MiB, %s" % (allowance // MiB, what), "%.0f MiB" % (x / MiB) if x else "n/a",
               check(x, "<=", allowance))
    x = ratio(med("dckpt_load_warm"), med("hash_copy_all"))
    target("(b) warm resharded load ≥ 0.8 × the verified-copy limit", r(x), check(x, ">=", 0.8))
    x = ratio(least, med("hash_copy_all"))
    reach = ("" if x is None else "the least work of this reshard through the page cache (no loader can do less) "
             "runs at %.2f× the verified-copy limit here%s" % (x, ": the target is out of reach" if x < 0.8 else ""))
    x = ratio(med("dckpt_load_warm"), least)
    target("(b) warm resharded load ≥ 0.8 × the least work of this reshard through the page cache", r(x),
           check(x, ">=", 0.8), reach)
    x = ratio(med("dckpt_load_cold"), fio_read)
    target("(b) cold resharded load ≥ 0.95 × the best fio read", r(x), check(x, ">=", 0.95))
    x, y = med("view_first_cold"), med("st_first_cold")
    target("(f) time to first tensor ≤ safetensors, cold", r(ratio(x, y)), check(x, "<=", y))
    x, y = med("view_first_warm"), med("st_first_warm")
    target("(f) time to first tensor ≤ safetensors, warm", r(ratio(x, y)), check(x, "<=", y))
    x = ratio(med("model_map_all_cold"), st_cold)
    target("(g) Rust whole-model load, verified, cold ≤ 1.0 × safetensors (its faster backend): zero-copy "
           "`map_all()`", r(x), check(x, "<=", 1.0))
    x = ratio(med("model_read_all_cold"), st_cold)
    target("(g) the same with verified copies, `read_all()`", r(x), check(x, "<=", 1.0))
    x = ratio(med("model_map_all_warm"), st_warm)
    target("(g) Rust whole-model load, verified, warm ≤ 1.5 × safetensors (its faster backend)", r(x),
           check(x, "<=", 1.5))
    b.targets = T
    L.append("## Targets")
    L.append("")
    L.append("| target | measured (median ratio or value) | status |")
    L.append("|---|---|---|")
    for name, value, status, reason in T:
        L.append("| %s | %s | %s |" % (name, value, status + (" (%s)" % reason if reason else "")))
    L.append("")
    L.append("Where a target is not met, bench/NOTES.md gives the measured reason and the plan.")
    L.append("")
    if b.notes:
        L.append("## Notes from this run")
        L.append("")
        for n in b.notes:
            L.append("- " + n)
        L.append("")
    L.append("## Raw samples")
    L.append("")
    L.append("```")
    for k in sorted(b.samples):
        L.append("%s: %s" % (k, ", ".join("%.6g" % v for v in b.samples[k])))
    if "plan_scale_output" in ex:
        L.append("")
        L.append("plan_scale:")
        L.append(ex["plan_scale_output"])
    L.append("```")
    L.append("")
    L.append("![chart](%s)" % os.path.basename(png_path))
    with open(md_path, "w") as f:
        f.write("\n".join(L) + "\n")
    chart(b, png_path)
    return md_path, png_path


def chart(b, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("(a) durable save, GB/s", 1 / GB, [("distckpt", "dckpt_save"), ("distckpt unaligned", "dckpt_save_unaligned"),
                                             ("DCP tc=1", "dcp1_save"),
                                             ("DCP tc=4", "dcp4_save"), ("safetensors", "st_save"),
                                             ("fio write+fsync", "fio_write_fsync"),
                                             ("fio direct qd16+fsync", "fio_write_direct_qd16")]),
        ("(b) resharded load, cold, GB/s", 1 / GB, [("distckpt", "dckpt_load_cold"), ("DCP", "dcp_load_cold"),
                                                    ("safetensors", "st_load_cold"),
                                                    ("fio buffered", "fio_read_buffered"),
                                                    ("fio direct", "fio_read_direct"),
                                                    ("fio direct qd16", "fio_read_direct_qd16")]),
        ("(b) resharded load, warm, GB/s", 1 / GB, [("distckpt", "dckpt_load_warm"),
                                                    ("distckpt no verify", "dckpt_load_warm_noverify"),
                                                    ("least work, mapped", "reshard_least_map"),
                                                    ("least work, pread", "reshard_least_read"),
                                                    ("least work, private copy", "reshard_least_private"),
                                                    ("verified copy", "hash_copy_all"),
                                                    ("DCP", "dcp_load_warm"), ("memcpy", "memcpy_all")]),
        ("(c) async save, s (steady state; lower is better)", 1, [("distckpt stall", "dckpt_async_stall"),
                                                                  ("DCP stall", "dcp_async_stall"),
                                                                  ("memcpy of state", "memcpy_state_prefaulted"),
                                                                  ("distckpt total", "dckpt_async_total"),
                                                                  ("DCP total", "dcp_async_total")]),
        ("(d) open + lookup, ms (1M chunks)", 1e3, [("distckpt", "dckpt_open_lookup"),
                                                    ("DCP pickle", "dcp_open_lookup")]),
        ("(f) time to first tensor, ms", 1e3, [("view() cold", "view_first_cold"), ("safetensors cold", "st_first_cold"),
                                               ("view() warm", "view_first_warm"),
                                               ("safetensors warm", "st_first_warm")]),
        ("(g) whole-model load, s (lower is better)", 1, [("distckpt map_all cold", "model_map_all_cold"),
                                                          ("distckpt read_all cold", "model_read_all_cold"),
                                                          ("safetensors mmap cold", "model_st_mmap_cold"),
                                                          ("safetensors pread cold", "model_st_pread_cold"),
                                                          ("distckpt map_all warm", "model_map_all_warm"),
                                                          ("safetensors mmap warm", "model_st_mmap_warm")]),
    ]
    fig, axes = plt.subplots(3, 3, figsize=(16, 13))
    for ax, (title, scale, bars) in zip(axes.flat, panels):
        names, meds, lo, hi = [], [], [], []
        for name, key in bars:
            st = b.stat(key)
            if st is None:
                continue
            names.append(name)
            meds.append(st[0] * scale)
            lo.append((st[0] - st[1]) * scale)
            hi.append((st[2] - st[0]) * scale)
        colors = ["#1f77b4" if n.startswith("distckpt") or n.startswith("view") else
                  "#7f7f7f" if n.startswith(("fio", "memcpy")) else "#ff7f0e" for n in names]
        ax.bar(range(len(names)), meds, yerr=[lo, hi], color=colors, capsize=4)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        if "ms" in title and any(m > 0 for m in meds) and max(meds) / max(1e-9, min(m for m in meds if m > 0)) > 50:
            ax.set_yscale("log")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle("distckpt vs torch.distributed.checkpoint, safetensors and the physical limit (%s; median, "
                 "min–max bars)" % b.machine_info["host"])
    fig.tight_layout()
    fig.savefig(path, dpi=90)


# What write() reads from a run, saved beside its results file, so that the report can be written again from the
# same samples (after a change to the tables or targets) without running the benchmarks again:
#   bench/.venv/bin/python bench/report.py bench/results/<date>-<host>.json [--out DIR]
_ARGS = ("io_pool_bytes", "load_ranks", "quick_mode", "runs", "save_ranks", "view_gib")
_FIELDS = ("ckpt_bytes", "elapsed", "extra", "machine_info", "notes", "num_tensors", "replicated_share", "samples",
           "total_bytes")


def save_state(b, path):
    import json
    state = {k: getattr(b, k, None) for k in _FIELDS}
    state["args"] = {k: getattr(b.args, k) for k in _ARGS}
    state["date"] = datetime.date.today().isoformat()
    with open(path, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)


def main():
    import argparse
    import json
    import statistics
    import types

    ap = argparse.ArgumentParser(description="Writes a results file again from a run's saved state.")
    ap.add_argument("state", help="the .json a bench/run wrote beside its results file")
    ap.add_argument("--out", help="where to write (default: beside the state)")
    a = ap.parse_args()
    with open(a.state) as f:
        state = json.load(f)
    b = types.SimpleNamespace(**{k: state.get(k) for k in _FIELDS})
    b.args = types.SimpleNamespace(out=a.out or os.path.dirname(os.path.abspath(a.state)), **state["args"])

    def stat(key):
        v = b.samples.get(key)
        return (statistics.median(v), min(v), max(v), len(v)) if v else None

    b.stat = stat
    print(*write(b, state["date"]))


if __name__ == "__main__":
    main()
