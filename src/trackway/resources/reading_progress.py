"""A progress bar over the bytes of a lengths file while the preflight reads it (none for a small file)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

SHOWN_FROM_BYTES = 8 * 2**20  # a smaller file is read before a bar would be seen


@contextmanager
def reading_progress(console: Console | None, path: str | Path | None) -> Iterator[Callable[[int], None] | None]:
    """Yields the callback `seq_lengths` readers advance with bytes read, or None when no bar is shown."""
    size = Path(path).stat().st_size if path and Path(path).is_file() else 0
    if console is None or size < SHOWN_FROM_BYTES:
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("reading lengths"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("lengths", total=size)
        yield lambda nbytes: bar.advance(task, nbytes)
