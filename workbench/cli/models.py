"""The model commands: ``models`` (the zoo, or ``--families``: the family x experiment
matrix), ``fetch``, ``verify`` (re-hashing models, runs and recordings) and ``prompts``."""

from __future__ import annotations

import argparse
import sys

from workbench.cli.render import _fill, _one_line, _out, _table
from workbench.core import paths


def cmd_models(args: argparse.Namespace) -> None:
    from workbench.models import cache, zoo

    if getattr(args, "families", False):
        _family_matrix()
        return
    rows = []
    for name, spec in zoo.MODELS.items():
        more = len(spec.wheels) - 1  # the first wheel names the model; the rest are counted
        rows.append({
            "name": name,
            "source": f"PyPI wheel {spec.wheels[0].requirement}" + (f" + {more} more"
                                                                    if more else ""),
            "architecture": spec.architecture,
            "layers": spec.n_layers, "heads (q/kv)": f"{spec.n_heads}/{spec.n_kv_heads}",
            "d_model": spec.d_model, "context": spec.n_ctx, "positions": spec.positions,
            "terms": spec.terms.name if spec.terms else "-",
            "cached": "yes" if cache.is_cached(name) else "no",
        })
    _out(_table(rows, list(rows[0])))
    _out()
    for name, spec in zoo.MODELS.items():
        _out(_fill(f"{name}: {spec.title} ({spec.hub_id}). Use for: {spec.uses}."
                   f"{_terms_note(name)}"))
    _out(f"\ncache: {paths.cache_dir()}  (set WORKBENCH_CACHE to move it)")
    _out("also accepted as MODEL: a Hugging Face hub id (needs a network), a local model "
         "folder, a .gguf file, or <run-id>:<step> for a trained checkpoint")


def _family_matrix() -> None:
    """``models --families``: the family x experiment matrix on tiny random weights, the
    bundled models' rows on real weights apart from it, and why a cell is not plain."""
    from workbench.harness.matrix import family_matrix, real_weights_matrix
    from workbench.models.adapters import FAMILIES

    cells = family_matrix()
    experiments = list(dict.fromkeys(c.experiment for c in cells))
    rows, notes = [], []
    for family, adapter in FAMILIES.items():
        row = {"family": family, "positions": adapter.positions, "q/k/v": adapter.layout}
        for c in (c for c in cells if c.family == family):
            row[c.experiment] = _mark(c)
            if c.reason and (c.works or not adapter.unsupported):
                notes.append(f"{family} / {c.experiment}: {c.label}")
        if adapter.unsupported:
            notes.append(f"{family} / every experiment: n/a: {adapter.unsupported}")
        rows.append(row)
    _out("On tiny random weights (every family):")
    _out(_table(rows, ["family", "positions", "q/k/v", *experiments]))
    _out()
    _out("On real weights (the bundled models, each its family's row on one real model):")
    _out(_table(_real_rows(real_weights_matrix()), ["model", "family", "layers",
                                                    *experiments]))
    _out()
    for note in notes:
        _out(f"* {note}")


def _mark(c) -> str:
    return ("works" if c.works else "n/a") + ("*" if c.reason else "")


def _real_rows(cells: list) -> list[dict[str, str]]:
    """One row per bundled model: its family, its layer types, its family's cells."""
    from workbench.models import zoo
    from workbench.models.adapters import adapter_for

    rows: dict[str, dict[str, str]] = {}
    for name, c in cells:
        spec = zoo.MODELS.get(name)
        row = rows.setdefault(name, {"model": name,
                                     "family": adapter_for(spec.architecture).family,
                                     "layers": spec.layers})
        row[c.experiment] = _mark(c)
    return list(rows.values())


def cmd_verify(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from workbench.harness.verify import damage_summary, verify

    checks = verify(args.names, runs_dir=args.out)
    _out(_table([asdict(c) for c in checks], ["name", "kind", "status", "detail"]))
    if (summary := damage_summary(checks)) is not None:
        sys.stderr.write(f"error: {_one_line(summary)}\n")  # it names stored files
        sys.exit(1)


def _terms_note(name: str) -> str:
    """`` Its weights come under <terms> (<their cached file>).`` or ``""``."""
    from workbench.models import cache, zoo

    terms = zoo.MODELS.get(name).terms
    return "" if terms is None else (f" Its weights come under the {terms.name} "
                                     f"({cache.terms_file(name)}).")


def cmd_fetch(args: argparse.Namespace) -> None:
    from workbench.models import cache, zoo

    names = args.names or zoo.MODELS.names()
    for name in names:
        zoo.MODELS.get(name)  # fail on an unknown name before downloading anything
    for name in names:
        cached = cache.is_cached(name) and not args.force
        path = cache.fetch(name, force=args.force)
        _out(f"{name}: {'already cached, verified' if cached else 'fetched and verified'} "
             f"-> {path}")
        if (terms := zoo.MODELS.get(name).terms) is not None:
            _out(f"{name}: the {terms.name} apply to these weights: {cache.terms_file(name)}")


def cmd_prompts(args: argparse.Namespace) -> None:
    from workbench.inputs.prompts import GENERATORS, file_sets

    for name, path in file_sets().items():
        _out(f"{name:18s} file {path}")
    for name, fn in GENERATORS.items():
        # the docstring's whole first paragraph, wrapped: its first line may end mid-sentence
        doc = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        _out(_fill(f"{name:18s} generated: {doc}", hanging=" " * 19))
