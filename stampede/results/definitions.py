"""What stampede measures, written once: the text `--help` prints and the report points
to, and the constants it cites. Imported by the CLI on every start: the stdlib only."""

# The latency percentiles every op reports (beside min and max): linear interpolation
# between order statistics, numpy's default, from exact int64 nanoseconds.
PERCENTILES = (50.0, 90.0, 99.0, 99.9)

# Latency histograms (histogram mode, the sidecar's CDFs): logarithmic buckets whose
# edges grow by GAMMA = (1 + a) / (1 - a), DDSketch's mapping with a relative accuracy
# a = 1%: a value read at its bucket's relative midpoint, 2 lo hi / (lo + hi), is within
# a of every value in the bucket. BUCKET_ERROR is that bound on a percentile.
BUCKET_ERROR = 0.01
GAMMA = (1 + BUCKET_ERROR) / (1 - BUCKET_ERROR)

METRICS = f"""\
what stampede measures (per layout, per op; all ranks start together after a barrier):
  op            stat, open (object stores: one HEAD each), header (read and parse a
                safetensors/HDF5 header), read (one block: os.preadv into a page-aligned
                buffer, or one ranged GET; ttfb = its time to first byte), close, index
                (a shared index read whole), verify (hashing and the finite check,
                timed apart from reads), restore (pseudo-op: from the phase's start,
                the first rank of the node leaving the start barrier, until the rank
                holds all its bytes); all ranks of a node on one clock
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
  storage / network part
                first start to last stop, all ranks, of the storage ops (list, index,
                stat, open, header, read, close) / of the exchange ops (bcast, allgather)
  iterations    warmup iterations are run and dropped; the report shows the median
                over iterations and its min-max spread, and warns when it is wide
  cache         warm = page cache as it is (a warm read is not a restore);
                cold = each rank's pages evicted (posix_fadvise DONTNEED) before each
                iteration, then how many are still cached (mincore: cache_resident_pct);
                direct = O_DIRECT with aligned buffers
  retries       requests the storage client retried (503 SlowDown, timeouts), per op,
                apart from count (successes) and errors (failed after retries)
archive: one CSV row per (run, layout, op), appended, schema-versioned, plus a JSON
sidecar per run (hosts, MPI library, file system, Slurm variables).
"""

SAVE_METRICS = """\
what stampede save measures (per layout, per op; all ranks start together after a
barrier, each holding its shard in memory; every save is a new version):
  op            snapshot (save.mode = async: the shard copied to a staging buffer, what
                stops training), mkdir (the version's directories: rank 0, or every rank
                with save.mkdir = every), create (O_CREAT|O_EXCL of the temporary name),
                open (a shared file, by its other writers), write (one block: pwritev
                from the page-aligned shard; O_DIRECT with run.cache = direct), fsync,
                close, rename (temporary -> final name), fsync_dir (the directory's
                entries), wait (for other ranks: a step that needs them all), validate
                (one extent evicted, re-read and hashed, or checked finite), publish (the
                layout's pointer replaced atomically), unlink / rmdir (retention: the
                versions beyond save.keep, deleted after the publish)
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

# The report's last line: where the definitions are, instead of repeating them per run.
POINTER = "definitions of every column: `stampede run --help` (what stampede measures)"
SAVE_POINTER = ("definitions of every column: `stampede save --help` (the save's ops) and "
                "`stampede run --help` (the rest)")
