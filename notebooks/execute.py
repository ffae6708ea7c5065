"""Execute the tutorial notebooks top to bottom, at their own sizes, into ``docs/notebooks/``:
the copies the documentation site shows, with every output and each figure's PNG and SVG.

``notebooks/*.ipynb`` are committed without outputs; their executed copies are committed in
the site's sources, and ``tests/notebooks`` checks that each copy is current (the same
cells, every code cell run, no error, every figure with its static images). After changing
a notebook, run it again here:

    make tutorials                                  # every notebook (about 25 minutes)
    .venv/bin/python notebooks/execute.py 03_head_pruning
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
EXECUTED = HERE.parent / "docs" / "notebooks"
TIMEOUT = 3600
"""Seconds a single cell may take (the 8,192-token recording and the training are long)."""


def execute(path: Path, out_dir: Path = EXECUTED) -> Path:
    """Run notebook ``path`` in a kernel of this Python, its runs and temporary folders in
    folders of their own that are removed afterwards, and write the executed copy."""
    nb = nbformat.read(path, as_version=4)
    scratch = Path(tempfile.mkdtemp(prefix="wb-nb-"))  # short: Ray's socket paths
    env = {**os.environ, "WORKBENCH_RUNS_DIR": str(scratch / "runs"),
           "TMPDIR": str(scratch)}
    client = NotebookClient(nb, kernel_name="python3", timeout=TIMEOUT,
                            resources={"metadata": {"path": str(HERE)}})
    try:
        client.execute(env=env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out_dir.mkdir(exist_ok=True)
    out = out_dir / path.name
    nbformat.write(nb, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks by name (default: all)")
    args = parser.parse_args(argv)
    paths = sorted(HERE.glob("*.ipynb"))
    known = {p.stem: p for p in paths}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"error: unknown notebook {unknown[0]!r}; notebooks: {', '.join(known)}",
              file=sys.stderr)
        return 2
    for path in [known[n] for n in args.names] or paths:
        start = time.monotonic()
        out = execute(path)
        print(f"{path.name}: executed in {time.monotonic() - start:.0f} s -> "
              f"{out.relative_to(HERE.parent)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
