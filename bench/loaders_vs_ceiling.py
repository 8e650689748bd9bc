"""Real loaders vs stampede's raw restore vs dd, on the same files, in one run, as ratios.

The script writes one checkpoint of --size (default 1 GiB) of fp16 tensors, 64 MiB
each, in every format a loader reads, each split in two so that the `files` policy gives
each of 2 ranks half:
  safetensors  2 shards + model.safetensors.index.json (safetensors' save_file)
  torch        2 shards pytorch_model-0000K-of-00002.bin (torch.save)
  dcp          a DCP checkpoint saved by 2 gloo ranks, each saving half the tensors
  tensorizer   2 files model-K.tensors (tensorizer's TensorSerializer)
Then, for each rank count (--ranks, default 1,2) and cache state (--caches, default
cold,warm), for each format:
  dd        one `dd bs=4M of=/dev/null` process per rank over the files that rank is
            given (the files policy, stampede.existing.assign.balance), all ranks started
            together; GB/s = the files' bytes / the slowest rank's wall time; --repeats,
            median. Cold: every file's pages evicted (posix_fadvise DONTNEED) before each.
  stampede  `mpiexec -n N stampede loaders` with checkpoint.assign = files: its ceiling
  loaders   (stampede's own restore, `stampede run --checkpoint`) and every loader that
            reads the format and is installed, same ranks, same cache state, one run;
            GB/s = the restore rows' agg GB/s (the median over --iterations).
Printed: per (ranks, cache, format, loader) the GB/s of the loader, the ceiling and dd,
and loader/ceiling (the loader's efficiency), loader/dd and ceiling/dd; the loader's
dominant phase. GB = 1e9 B. Noise from other work on the machine falls on all three.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import (
    add_scratch_parent_option,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    mpiexec_command,
    read_archive,
    run_checked,
    scratch_directory,
    scratch_text,
    write_job_toml,
)

from stampede.existing.assign import balance
from stampede.existing.scan import scan
from stampede.results.cells import Row
from stampede.units import parse_size

TENSOR_BYTES = 64 * 2**20
FORMATS = ("safetensors", "torch", "dcp", "tensorizer")
VENV_PYTHON = Path(sys.executable)


def parse_args() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--size", default="1GiB", help="checkpoint size (default 1GiB)")
    parser.add_argument("--ranks", default="1,2", help="rank counts (default 1,2)")
    parser.add_argument("--caches", default="cold,warm", help="cache states (default cold,warm)")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help=f"checkpoint formats (default {','.join(FORMATS)})")
    parser.add_argument("--iterations", type=int, default=3,
                        help="measured iterations of each loader and the ceiling (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="dd repeats (default 3)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    try:
        args.size_bytes = parse_size(args.size)
        args.rank_counts = comma_separated(args.ranks, int)
    except ValueError as error:
        parser.error(str(error))
    args.cache_states = comma_separated(args.caches, str)
    args.format_names = comma_separated(args.formats, str)
    return args


# --- the checkpoint, in every format ------------------------------------------------------

def tensors(size_bytes: int) -> list[dict[str, object]]:
    """Two halves of a state_dict of fp16 tensors (64 MiB each, the last one shorter)."""
    import torch

    generator = torch.Generator().manual_seed(3)
    halves: list[dict[str, object]] = [{}, {}]
    count = max(size_bytes // TENSOR_BYTES, 2)
    for index in range(count):
        rows = TENSOR_BYTES // 2 // 4096
        tensor = torch.randn(rows, 4096, generator=generator).to(torch.float16)
        halves[index * 2 // count][f"layers.{index}.weight"] = tensor
    return halves


def write_formats(root: Path, halves: list[dict[str, object]], formats: list[str]) -> dict[str, Path]:
    import json

    import torch
    from safetensors.torch import save_file

    written = {}
    if "safetensors" in formats:
        directory = root / "safetensors"
        directory.mkdir()
        weight_map = {}
        for number, half in enumerate(halves, 1):
            name = f"model-{number:05d}-of-00002.safetensors"
            save_file(half, directory / name, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(half, name))
        (directory / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": weight_map}))
        written["safetensors"] = directory
    if "torch" in formats:
        directory = root / "torch"
        directory.mkdir()
        for number, half in enumerate(halves, 1):
            torch.save(half, directory / f"pytorch_model-{number:05d}-of-00002.bin")
        written["torch"] = directory
    if "tensorizer" in formats:
        from tensorizer import TensorSerializer

        directory = root / "tensorizer"
        directory.mkdir()
        for number, half in enumerate(halves, 1):
            serializer = TensorSerializer(str(directory / f"model-{number}.tensors"))
            serializer.write_state_dict(half)
            serializer.close()
        written["tensorizer"] = directory
    if "dcp" in formats:
        written["dcp"] = write_dcp(root / "dcp", halves)
    os.sync()
    return written


def write_dcp(directory: Path, halves: list[dict[str, object]]) -> Path:
    """torch.distributed.checkpoint.save on 2 gloo ranks, each saving its half."""
    import torch

    halves_path = directory.with_suffix(".halves.pt")
    torch.save(halves, halves_path)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1"}
    run_checked([str(VENV_PYTHON), __file__, "save-dcp", str(halves_path), str(directory)],
                env=env)
    halves_path.unlink()
    return directory


def _save_dcp_rank(rank: int, port: int, halves_path: str, directory: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        dcp.save(torch.load(halves_path)[rank], checkpoint_id=directory)
    finally:
        dist.destroy_process_group()


# --- dd and stampede loaders on the same files --------------------------------------------

def rank_files(root: Path, nranks: int) -> list[list[Path]]:
    """The files each rank is given under the files policy (stampede's own balance)."""
    catalogue = scan(str(root))
    owners = balance(catalogue.files, nranks)
    return [[Path(catalogue.root) / relpath for relpath, _ in catalogue.files
             if owners[relpath] == rank] for rank in range(nranks)]


def evict(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def dd_gbps(files_by_rank: list[list[Path]], cold: bool, repeats: int) -> float:
    """Median over repeats of the files' bytes / the slowest rank's wall time."""
    every = [path for files in files_by_rank for path in files]
    total = sum(path.stat().st_size for path in every)
    results = []
    for _ in range(repeats):
        if cold:
            evict(every)
        else:
            for path in every:   # warm: read once, untimed
                run_checked(["dd", f"if={path}", "bs=4M", "of=/dev/null", "status=none"])
        scripts = [" ; ".join(f"dd if={path} bs=4M of=/dev/null status=none" for path in files)
                   or "true" for files in files_by_rank]
        start = time.perf_counter()
        procs = [subprocess.Popen(["sh", "-c", script]) for script in scripts]
        if any(proc.wait() for proc in procs):
            raise SystemExit("dd failed")
        results.append(total / (time.perf_counter() - start) / 1e9)
    return statistics.median(results)


def run_loaders(scratch: Path, root: Path, nranks: int, cache: str, iterations: int,
                tag: str) -> list[Row]:
    archive = scratch / f"loaders-{tag}.csv"
    job = write_job_toml(scratch / f"loaders-{tag}.toml", {
        "target": {"path": root},
        "checkpoint": {"source": "existing", "assign": ["files"], "block_size": "4MiB"},
        "run": {"iterations": iterations, "warmup": 1, "cache": cache},
        "archive": {"path": archive},
    })
    run_checked(mpiexec_command(nranks, str(VENV_PYTHON), "-m", "stampede", "loaders", str(job),
                                "--devices", "cpu"))
    return read_archive(archive)


def measure(scratch: Path, written: dict[str, Path], args: argparse.Namespace) -> list[tuple[object, ...]]:
    from stampede.results.loaders import loader_lines

    table = []
    for nranks in args.rank_counts:
        for cache in args.cache_states:
            for fmt, root in written.items():
                files = rank_files(root, nranks)
                dd_before = dd_gbps(files, cache == "cold", args.repeats)
                rows = run_loaders(scratch, root, nranks, cache, args.iterations,
                                   f"{fmt}-{nranks}-{cache}")
                dd_after = dd_gbps(files, cache == "cold", args.repeats)
                dd = statistics.median([dd_before, dd_after])
                lines = loader_lines(rows)
                ceiling = next(line.gbps for line in lines if line.loader.startswith("stampede"))
                for line in lines:
                    if not line.loader.startswith("stampede"):
                        table.append((nranks, cache, fmt, line.loader, line.gbps, ceiling, dd,
                                      line.efficiency, line.dominant))
                print(f"  {nranks} rank(s) {cache} {fmt}: ceiling {ceiling:.2f} GB/s, dd "
                      f"{dd:.2f} GB/s", flush=True)
    return table


def print_table(table: list[tuple[object, ...]]) -> None:
    header = (f"{'ranks':>5} {'cache':<5} {'format':<11} {'loader':<16} {'loader':>7} "
              f"{'ceiling':>7} {'dd':>6} {'ld/ceil':>7} {'ld/dd':>6} {'ceil/dd':>7}  dominant")
    print(header)
    print(f"{'':>5} {'':<5} {'':<11} {'':<16} {'GB/s':>7} {'GB/s':>7} {'GB/s':>6}")
    print("-" * len(header))
    for nranks, cache, fmt, loader, gbps, ceiling, dd, efficiency, dominant in table:
        print(f"{nranks:>5} {cache:<5} {fmt:<11} {loader:<16} {gbps:>7.2f} {ceiling:>7.2f} "
              f"{dd:>6.2f} {efficiency:>7.2f} {gbps / dd:>6.2f} {ceiling / dd:>7.2f}  {dominant}")


def main() -> int:
    if sys.argv[1:2] == ["save-dcp"]:
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        mp.spawn(_save_dcp_rank, args=(port, sys.argv[2], sys.argv[3]), nprocs=2, join=True)
        return 0
    args = parse_args()
    with scratch_directory("stampede-loaders-", args.dir) as scratch:
        print(f"{machine_text(with_ram=True)}; {scratch_text(scratch)}; load average "
              f"{load_average_text()}")
        started = time.perf_counter()
        written = write_formats(scratch, tensors(args.size_bytes), args.format_names)
        print(f"wrote {args.size} in {', '.join(written)} in "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        table = measure(scratch, written, args)
        print()
        print_table(table)
        print("GB = 1e9 B/s; loader and ceiling: median over iterations of the restore's agg "
              "GB/s (barrier -> last rank's last tensor in memory, the ranks' assigned bytes); "
              "dd: the same files, whole, one dd per rank, median of repeats before and after; "
              "ld/ceil = the loader's efficiency")
    return 0


if __name__ == "__main__":
    sys.exit(main())
