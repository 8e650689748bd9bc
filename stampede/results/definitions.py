"""What stampede measures, written once: the text `--help` prints and the report points
to, and the constants it cites. Imported on every rank: the stdlib only, the text made on
first use. Each op's own definition is stampede.ops's; the paragraphs here list them."""

from stampede.ops import BY_NAME, NETWORK_OPS, OPS_TABLE, PSEUDO_OPS, SAVE_ORDER, STORAGE_OPS

# The latency percentiles every op reports (beside min and max): linear interpolation
# between order statistics, numpy's default, from exact int64 nanoseconds.
PERCENTILES = (50.0, 90.0, 99.0, 99.9)

# Latency histograms (histogram mode, the sidecar's CDFs): logarithmic buckets whose
# edges grow by GAMMA = (1 + a) / (1 - a), DDSketch's mapping with a relative accuracy
# a = 1%: a value read at its bucket's relative midpoint, 2 lo hi / (lo + hi), is within
# a of every value in the bucket. BUCKET_ERROR is that bound on a percentile.
BUCKET_ERROR = 0.01
GAMMA = (1 + BUCKET_ERROR) / (1 - BUCKET_ERROR)



def _paragraph(label: str, text: str) -> str:
    """One entry of a definitions list: the label, then its text wrapped beside it (below
    it when the label is too long)."""
    import textwrap  # with the text (see __getattr__), not on every rank

    indent = " " * 16
    if len(label) > 13:
        return f"  {label}\n" + textwrap.fill(text, width=88, initial_indent=indent,
                                              subsequent_indent=indent, break_on_hyphens=False)
    return textwrap.fill(text, width=88, initial_indent=f"  {label:<14}",
                         subsequent_indent=indent, break_on_hyphens=False)


def _ops(names: tuple[str, ...]) -> str:
    """An entry per op: its definition (stampede.ops)."""
    return "\n".join(_paragraph(name, BY_NAME[name].definition) for name in names)


_RUN_OPS = tuple(op.name for op in OPS_TABLE if "restore" in op.phases)
_SAVE_OPS = tuple(name for name in SAVE_ORDER if name not in PSEUDO_OPS)

def _metrics() -> str:
    return f"""\
what stampede measures (per layout, per op; all ranks start together after a barrier):
  ops           each timed alone; all ranks of a node on one clock (a pass of only
                stat, open and close is stamped in C around each call:
                stampede/oploop.c):
{_ops(_RUN_OPS)}
  latency       min/p50/p90/p99/p99.9/max over every rank's samples of every measured
                iteration (exact, int64 ns, linear interpolation), with the count;
                run.samples = histogram: p50-p99.9 from log buckets, within
                {BUCKET_ERROR:.0%}
  agg GB/s      total bytes / (last stop - first start over all ranks), GB = 1e9 B;
                per-rank rates are never summed (IOR's definition)
  time to last rank / first done
                slowest / fastest rank's restore time; straggler = slowest / median
  slowest-rank GB/s
                bytes per rank / time to last rank: BW_rank_io of the recovery model
  read amplification
                bytes read from storage per iteration / the unique bytes the job
                needed (the union of what its ranks must hold): 1.0x read once, 4.0x
                when 4 ranks each read the whole file; also at the worst node and rank
  storage / network part
{_paragraph("", "first start to last stop, all ranks, of the storage ops ("
                + ", ".join(STORAGE_OPS) + ") / of the exchange ops ("
                + ", ".join(NETWORK_OPS) + ")")}
  iterations    warmup iterations are run and dropped; the report shows the median
                over iterations and its min-max spread, and warns when it is wide
  cache         warm = page cache as it is (a warm read is not a restore);
                cold = each rank's pages written back (fdatasync) and evicted
                (posix_fadvise DONTNEED) before each iteration, then how many are still
                cached (mincore: cache_resident_pct);
                direct = O_DIRECT with aligned buffers
  retries       requests the storage client retried (503 SlowDown, timeouts), per op,
                apart from count (successes) and errors (failed after retries)
archive: one CSV row per (run, layout, op), appended, schema-versioned, plus a JSON
sidecar per run (hosts, MPI library, file system, Slurm variables).
"""

def _save_metrics() -> str:
    return f"""\
what stampede save measures (per layout, per op; all ranks start together after a
barrier, each holding its shard in memory; every save is a new version):
  ops           each timed alone:
{_ops(_SAVE_OPS)}
  save          pseudo-op: phase start -> the rank's last fsync (its bytes durable under
                their final names); time to last rank = the save's duration, agg GB/s =
                bytes saved / that; with save.durability = none it ends at the rank's
                last close or rename: buffered, never storage GB/s
  blocked       pseudo-op: phase start -> the rank could train again: after the snapshot
                (async) or once every rank's bytes are durable (sync)
  published     pseudo-op, rank 0: phase start -> the pointer durable; a version that
                failed validation is never published and the previous one stays
  unprotected   the window with no valid published version: from the first unlink of an
                old version to the end of the new one's publish, if it came first; 0 s
                when retention waits for the publish, as it must
latency, agg GB/s, spreads and the archive are defined as for run (stampede run --help).
"""


def __getattr__(name: str) -> str:
    """METRICS and SAVE_METRICS, made on first use: every rank imports the constants above
    (stampede.results.histogram), only help and reports print the text."""
    texts = {"METRICS": _metrics, "SAVE_METRICS": _save_metrics}
    if name not in texts:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    text = globals()[name] = texts[name]()
    return text

# The report's last line: where the definitions are, instead of repeating them per run.
POINTER = "definitions of every column: `stampede run --help` (what stampede measures)"
SAVE_POINTER = ("definitions of every column: `stampede save --help` (the save's ops) and "
                "`stampede run --help` (the rest)")
