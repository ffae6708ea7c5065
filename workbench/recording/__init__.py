"""Running a model with hooks: hook names, recordings on disk, and streaming reductions.

``hooks`` names every hook point, ``writer`` writes recordings and ``reader`` reads them
back (a Zarr v3 store, ``zarr_store``; sparse top-k patterns, ``sparse``; the old block
files, ``legacy``), ``reductions`` reduces patterns to per-head numbers while the forward
pass runs.
"""

from workbench.core.options import PatternStorage, StoreDtype
from workbench.recording.reader import Recording
from workbench.recording.writer import record

__all__ = ["PatternStorage", "Recording", "StoreDtype", "record"]
