"""The foundation every layer stands on: errors, paths, progress, the registry, checksums.

Nothing here imports torch or any other part of the workbench.
"""
