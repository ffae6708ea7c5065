"""The run store: one folder per run with provenance, tables checked against their schemas.

Importable without torch, so table schemas and readers (the dashboard) stay light.
"""

from workbench.store.runs import Run, RunStore

__all__ = ["Run", "RunStore"]
