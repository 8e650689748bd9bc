"""`run.ceiling = true`: the raw-read ceiling of every node, measured once before the
run's first layout, on the node's own share of the checkpoint the job reads.

Per node, one rank (the first on its host) reads; the others wait at the barriers. The
checkpoint's files, laid end to end, are cut into one contiguous share per node, so no
two nodes read the same bytes and no page one node reads is another's. REPEATS rounds,
each of every stream count (stampede.results.ceiling.STREAM_COUNTS; rounds rather than
one count's repeats in a row, so a slow spell of the machine falls on several counts'
one repeat, not on one count's median). For each read, untimed: the share is evicted
(posix_fadvise DONTNEED, as run.cache = cold evicts) and mincore asked what is still
cached; then, after a barrier of every rank (all nodes read at once, as a restore's
nodes do), the share is cut into one contiguous piece per stream, and each stream (a
thread: os.preadv releases the GIL) reads its piece with REQUEST_BYTES requests into its
own page-aligned buffer, allocated and faulted in before the clock starts. The time is
the streams' common start to the last stream's end; the bytes are what preadv returned.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from stampede import mpi
from stampede.buffers import AlignedBuffer
from stampede.results.ceiling import (
    REPEATS,
    REQUEST_BYTES,
    STREAM_COUNTS,
    Ceiling,
    NodeCeiling,
    StreamRead,
    pieces,
    split_evenly,
)
from stampede.run.outcome import MAX_MESSAGES

PAGE_BYTES = 4096


def measure(comm: mpi.Comm, files: Sequence[tuple[str, int]],
            stream_counts: Sequence[int] = STREAM_COUNTS, repeats: int = REPEATS) -> Ceiling:
    """Every node's reads at every stream count, `repeats` times, as a Ceiling on every
    rank (a rank's next step may hang on whether one was measured: all must agree).
    `files`: (absolute path, bytes) of the checkpoint's files, the same on every rank."""
    rank = comm.Get_rank()
    messages: list[str] = []
    hosts = mpi.bcast(comm, mpi.gather(comm, mpi.processor_name(comm)) or [])
    nodes = sorted(set(hosts))
    host = hosts[rank]
    leads = hosts.index(host) == rank
    total = sum(size for _, size in files)
    start, end = split_evenly(total, len(nodes), REQUEST_BYTES)[nodes.index(host)]
    share = pieces(files, start, end)
    reads = []
    for streams in [count for _ in range(repeats) for count in stream_counts]:
        resident = _evict(share, messages) if leads else 0
        mpi.barrier(comm)
        if leads:
            reads.append(_read(share, streams, resident, messages))
        mpi.barrier(comm)
    found = mpi.gather(comm, (NodeCeiling(host, tuple(reads)) if leads else None, messages))
    ceiling = Ceiling(()) if found is None else Ceiling(   # rank 0's is broadcast
        tuple(node for node, _ in found if node is not None),
        tuple(dict.fromkeys(text for _, said in found for text in said)))
    return mpi.bcast(comm, ceiling)


def _evict(share: list[tuple[str, int, int]], messages: list[str]) -> int:
    """Untimed: the share out of the page cache; the bytes mincore still finds cached."""
    from stampede.backends.posix import PosixBackend
    from stampede.run.residency import resident_bytes

    cached = 0
    for path, offset, length in share:
        try:
            PosixBackend.evict(path, offset, length)   # dirty pages written back first
            cached += resident_bytes(path, offset, length)[0]
        except OSError as error:
            _say(messages, f"ceiling: evict {path}: {error.strerror}")
    return cached


def _read(share: list[tuple[str, int, int]], streams: int, resident: int,
          messages: list[str]) -> StreamRead:
    """One stream count: each stream's piece read sequentially, all streams at once."""
    asked = sum(length for _, _, length in share)
    own = [pieces_of(share, lo, hi) for lo, hi in split_evenly(asked, streams, PAGE_BYTES)]
    fds = {path: os.open(path, os.O_RDONLY) for path, _, _ in share}
    buffers = [AlignedBuffer(max(min(REQUEST_BYTES, sum(n for _, _, n in piece)), PAGE_BYTES),
                             populate=True) for piece in own]
    ready = threading.Barrier(streams + 1)
    try:
        with ThreadPoolExecutor(max_workers=streams) as pool:
            futures = [pool.submit(_stream, piece, fds, buffer, ready)
                       for piece, buffer in zip(own, buffers, strict=True)]
            ready.wait()
            began = time.perf_counter()
            results = [future.result() for future in futures]
            seconds = time.perf_counter() - began
    finally:
        for buffer in buffers:
            buffer.close()
        for fd in fds.values():
            os.close(fd)
    for _, error in results:
        if error:
            _say(messages, f"ceiling: {streams} streams: {error}")
    return StreamRead(streams, asked, sum(nbytes for nbytes, _ in results), seconds, resident)


def pieces_of(share: list[tuple[str, int, int]], start: int, end: int) -> list[tuple[str, int, int]]:
    """(path, offset, length) of the bytes [start, end) of the node's share."""
    found = pieces([(f"{index}", length) for index, (_, _, length) in enumerate(share)],
                   start, end)
    return [(share[int(index)][0], share[int(index)][1] + offset, length)
            for index, offset, length in found]


def _stream(piece: list[tuple[str, int, int]], fds: dict[str, int], buffer: AlignedBuffer,
            ready: threading.Barrier) -> tuple[int, str]:
    """One stream: its piece in REQUEST_BYTES requests; (bytes read, the error if one)."""
    ready.wait()
    done = 0
    try:
        for path, offset, length in piece:
            fd, position, end = fds[path], offset, offset + length
            while position < end:
                view = buffer.prefix(min(buffer.nbytes, end - position))
                got = os.preadv(fd, [view], position)
                if got <= 0:
                    return done, f"{path}: short read at {position}"
                done += got
                position += got
    except OSError as error:
        return done, f"{error.strerror}"
    return done, ""


def _say(messages: list[str], text: str) -> None:
    if len(messages) < MAX_MESSAGES and text not in messages:
        messages.append(text)
