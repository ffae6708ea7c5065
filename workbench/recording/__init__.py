"""Running a model with hooks: hook names, recordings on disk, and streaming reductions.

``hooks`` names every hook point, ``record`` writes and reads recordings, ``reductions``
reduces patterns to per-head numbers while the forward pass runs.
"""

from workbench.core.options import StoreDtype
from workbench.recording.record import Recording, record

__all__ = ["Recording", "StoreDtype", "record"]
