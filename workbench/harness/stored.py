"""The folders a run holds besides its tables, each verified against its own manifest:
recordings (every folder holding ``index.json``) and the checkpoints a training run saved.

``workbench verify`` re-hashes them (:mod:`workbench.harness.verify`), and so does
``--reuse`` before it hands back an earlier run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workbench.models import checkpoints
from workbench.recording.index import INDEX
from workbench.recording.reader import Recording


@dataclass(frozen=True)
class StoredFiles:
    """A recording or checkpoint folder inside a run, verified against its own manifest."""

    kind: Literal["recording", "checkpoint"]
    path: Path

    def verify(self) -> None:
        """Re-hash every file of the folder.

        Raises:
            WorkbenchError / ChecksumError: the first file that fails its check.
        """
        if self.kind == "recording":
            Recording.open(self.path).verify()
        else:
            checkpoints.verify(self.path)


def stored_files(run_dir: Path) -> list[StoredFiles]:
    """The recordings (every folder holding ``index.json``, e.g. ``recording/``,
    ``example/``) and checkpoints in a run folder, in a stable order.

    Args:
        run_dir: the run's folder.

    Returns:
        One entry per recording, then one per checkpoint (by layers, then step).
    """
    found = []
    for folder, dirs, files in os.walk(run_dir, followlinks=False):
        dirs.sort()
        if INDEX in files:
            found.append(StoredFiles("recording", Path(folder)))
    found += [StoredFiles("checkpoint", ref.path) for ref in checkpoints.list_checkpoints(run_dir)]
    return found
