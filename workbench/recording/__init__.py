"""Running a model with hooks: hook names, recordings on disk, and streaming reductions.

``hooks`` names every hook point, ``record`` writes and reads recordings (a Zarr v3 store,
``zarr_store``; sparse top-k patterns, ``sparse``; the old block files, ``legacy``),
``reductions`` reduces patterns to per-head numbers while the forward pass runs.
"""

from workbench.core.options import PatternStorage, StoreDtype
from workbench.recording.record import Recording, record

__all__ = ["PatternStorage", "Recording", "StoreDtype", "record"]
