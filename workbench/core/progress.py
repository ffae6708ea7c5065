"""Progress bars that only the CLI turns on; library code stays silent by default."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_enabled = False


def enable(flag: bool = True) -> None:
    """Show progress bars on stderr (the CLI calls this)."""
    global _enabled
    _enabled = flag


def track(items: Iterable[T], *, total: int | None = None, desc: str = "") -> Iterator[T]:
    """Iterate over ``items``, with a tqdm bar when progress is enabled."""
    if not _enabled:
        yield from items
        return
    from tqdm.auto import tqdm

    yield from tqdm(items, total=total, desc=desc, leave=False, dynamic_ncols=True)
