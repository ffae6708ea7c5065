"""The foundation every layer stands on: errors, paths, progress, the registry, checksums.

Nothing here imports any other part of the workbench, nor torch at import time
(:mod:`~workbench.core.devices` asks torch only when it checks a device).
"""
