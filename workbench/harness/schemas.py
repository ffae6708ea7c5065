"""JSON Schemas of every file the workbench stores or reads, generated from their records.

Each file format has one record type (:mod:`workbench.core.records`); its JSON Schema is
generated from that type and kept in ``data/schemas/<name>.schema.json``, so that other
tools can read the run store, recordings, the model cache and the claims registry without
the workbench. A test regenerates them and fails when a committed schema differs from its
record, so the two cannot drift.

Examples:
    python -m workbench.harness.schemas            # rewrite data/schemas/
    python -m workbench.harness.schemas --check    # exit 1 naming a stale schema
"""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench.core import paths
from workbench.core.records import Schema, schema_text, write_schemas
from workbench.harness.claims import CLAIMS_FILE
from workbench.harness.sweeps.spec import Spec
from workbench.models.cache import RECORDS as CACHE_RECORDS
from workbench.models.checkpoints import RECORDS as CHECKPOINT_RECORDS
from workbench.recording.index import RECORDS as RECORDING_RECORDS
from workbench.store.records import RECORDS as STORE_RECORDS

FORMATS: dict[str, Schema] = {
    **STORE_RECORDS,
    **RECORDING_RECORDS,
    **CACHE_RECORDS,
    **CHECKPOINT_RECORDS,
    "claims": CLAIMS_FILE,
    "sweep-spec": Spec,
}
"""Every file format by schema name."""


def folder() -> Path:
    """Where the schemas are kept: ``data/schemas``."""
    return paths.data_dir() / "schemas"


def stale(where: Path | None = None) -> list[str]:
    """The schema names whose committed file is missing or differs from its record."""
    where = where or folder()
    out = []
    for name, record in FORMATS.items():
        path = where / f"{name}.schema.json"
        if not path.is_file() or path.read_text(encoding="utf-8") != schema_text(
                record, title=name):
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write or check data/schemas/.")
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        if names := stale():
            raise SystemExit(f"stale schemas in {folder()}: {', '.join(names)}; "
                             "run `python -m workbench.harness.schemas`")
        return 0
    folder().mkdir(parents=True, exist_ok=True)
    write_schemas(FORMATS, folder())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
