"""Format 1 recordings (``index.json`` + ``attn/L*.bin`` + ``resid/B*.bin``), read-only.

Recordings written before the Zarr store (:mod:`workbench.recording.zarr_store`) keep
opening: :class:`workbench.recording.reader.Recording` reads them through this module.
On disk::

    index.json         prompts, tokens, shapes, and for every block its offset and dtype
    attn/L{l:03d}.bin  layer l's patterns, prompt after prompt, each [head, query, key]
    resid/B{b:03d}.bin boundary b's residual stream, each [pos, d_model]

Nothing writes this format any more; its ``index.json`` is typed with format 2's
(:class:`workbench.recording.index.RecordingIndex`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workbench.recording.index import data_file

if TYPE_CHECKING:
    from workbench.recording.index import RecordingIndex


def block(root: Path, index: RecordingIndex, kind: str, layer: int, prompt: int,
          shape: tuple[int, ...]) -> np.memmap:
    """One prompt's block of a format-1 recording, memory-mapped (nothing else is read).

    Args:
        root: the recording folder.
        index: its checked ``index.json`` (format 1: every block lies inside its file).
        kind: ``attn`` (shape ``[head, query, key]``) or ``resid`` (``[pos, d_model]``).
        layer: the layer, or the boundary for ``resid``.
        prompt: the prompt.
        shape: the block's shape.

    Returns:
        The block, read-only.
    """
    assert index.blocks is not None
    offset, dtype = index.blocks[f"{kind}/{layer}"][prompt]
    return np.memmap(root / data_file(kind, layer), dtype=dtype, mode="r", offset=offset,
                     shape=shape)
