"""Page-aligned, reusable read buffers.

Reads from the page cache into a buffer that is not page-aligned (a bytearray or a numpy
array) run 2-5x slower than into an aligned one, and O_DIRECT refuses them outright. An
anonymous mmap is always page-aligned, so every read buffer comes from here.
"""

import mmap


class AlignedBuffer:
    """One mmap-backed buffer of `nbytes`, reused for every block a rank reads or writes."""

    def __init__(self, nbytes: int, populate: bool = False) -> None:
        """populate: fault every page in now, so no first touch lands in a timed copy."""
        self.nbytes = nbytes
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if populate else 0)
        self._map = mmap.mmap(-1, max(nbytes, mmap.PAGESIZE), flags=flags)
        self._whole = memoryview(self._map)
        self.view = self._whole[:nbytes]
        self._slices: dict[int, memoryview] = {nbytes: self.view}

    def prefix(self, length: int) -> memoryview:
        """The first `length` bytes as a view, cached: no allocation in the read loop."""
        view = self._slices.get(length)
        if view is None:
            view = self._slices[length] = self.view[:length]
        return view

    def close(self) -> None:
        for view in self._slices.values():
            view.release()
        self._slices.clear()
        try:
            self._whole.release()
            self._map.close()
        except BufferError:
            # A view of it is still referenced (a failed request's traceback, a client
            # that kept a slice): the map is freed with the last reference instead.
            pass

    def __enter__(self) -> "AlignedBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
