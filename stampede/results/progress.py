"""Progress bars for work that takes seconds, on rank 0 only; rich is imported lazily."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar(total: int, description: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """Yield an `advance(nbytes)` function; a no-op unless enabled and on a terminal."""
    if not enabled:
        yield lambda nbytes: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda nbytes: None
        return
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=console, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda nbytes: progress.advance(task, nbytes)
