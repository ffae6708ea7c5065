"""The experiment commands: ``run``, ``experiments`` and ``demo``, and the experiment help
(``workbench run --help`` lists the experiments; ``run EXPERIMENT --help`` shows one in full:
its models, config fields, demo config, tables and wall time)."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

from workbench.cli.record import _heads_mask
from workbench.cli.render import _WIDTH, _cell, _duration, _fill, _out, _wrapped_table
from workbench.core import paths
from workbench.core.devices import chosen_device


def cmd_run(args: argparse.Namespace) -> None:
    from workbench.harness.experiment import run_experiment

    device = chosen_device(args.device)
    run = run_experiment(args.experiment, args.model, args.set or [], runs_dir=args.out,
                         dtype=args.dtype, reuse=args.reuse, heads_mask=_heads_mask(args),
                         device=device, attention=args.attention)
    for line in run.meta.summary:  # a reused run's, as stored
        _out(_cell(line))
    _out(_cell(run.path))


def cmd_experiments(args: argparse.Namespace) -> None:
    from workbench.harness.experiment import all_experiments

    for exp in all_experiments():
        _out(f"{exp.name}  ({exp.module})")
        _out(_fill(exp.description, indent="  "))
        _out(textwrap.indent(_fields_text(exp), "    "))
        _out(_fill("tables: " + ", ".join(exp.tables or {}), indent="  ", hanging="    "))
        _out()


def cmd_demo(args: argparse.Namespace) -> None:
    from workbench.harness.demo import run_demo

    models = [m.strip() for m in args.models.split(",") if m.strip()] \
        if args.models is not None else None
    device = chosen_device(args.device)
    for line in run_demo(models, args.out, fresh=args.fresh, device=device):
        _out(line)
    _out(str(paths.runs_dir(args.out)))


def set_text(value: Any) -> str:
    """A value as ``--set`` takes it: ``1,2,8``, ``true``, ``none``; ``(empty)`` for an
    empty tuple (``--set name=``)."""
    if isinstance(value, (tuple, list)):
        return ",".join(set_text(v) for v in value) or "(empty)"
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else str(value)


def _fields_text(exp: Any) -> str:
    from workbench.harness import config

    rows = [{"field": f.name, "type": f.type, "default": set_text(f.default),
             "range": f.range, "help": f.help} for f in config.fields(exp.config)]
    return _wrapped_table(rows, ["field", "type", "default", "range", "help"], _WIDTH - 4)


def _wall_time_lines(exp: Any, root: Path) -> list[str]:
    """How long the default and demo configs took here, from the stored runs."""
    from workbench.harness.timing import wall_times
    from workbench.store.runs import RunStore

    times = wall_times(exp, RunStore(root)) if root.is_dir() else []
    if not times:
        return [f"no complete run of its default or demo config in {root} to time; its "
                f"page of the documentation, docs/experiments/{exp.name}.md, gives the wall "
                "times measured on 2 cores"]
    lines = [f"from the newest complete runs in {root} (start to end of each run; the model "
             "had loaded before):"]
    for t in times:
        model = "its own models" if t.model == "-" else t.model
        cores = f", {t.cpu_count} cores" if t.cpu_count and t.busy is None else ""
        load = "" if t.busy is None else f", {t.load}"
        lines.append(f"{t.config} on {model}: {_duration(t.seconds)} "
                     f"({t.ended_at[:16].replace('T', ' ')}{cores}{load}; run {t.run_id})")
    if any(t.busy for t in times):
        lines.append("a busy run's time includes waiting for the cores: rerun it on an idle "
                     "machine for its own")
    return lines


NEEDS = {"any": "any model its family supports", "causal": "a causal (left-to-right) model",
         "causal_lm": "a causal language model with a trained LM head"}
"""What an experiment's ``requires`` asks of its model, as ``run EXPERIMENT --help`` and the
documentation site say it."""


def _model_lines(exp: Any) -> list[str]:
    """What ``exp`` takes, from the checks its runs make: what it requires, then each
    model family it works on and each it refuses, with the reason (the family x
    experiment matrix, :mod:`workbench.harness.matrix`)."""
    from workbench.harness import matrix
    from workbench.models.adapters import FAMILIES

    cells = [matrix.cell(adapter, exp) for _, adapter in FAMILIES.items()]
    works = [c.family for c in cells if c.works]
    lines = [f"model: {NEEDS[exp.requires]}",
             "works on the families: " + (", ".join(works) or "none")]
    lines += [f"refuses {c.family}: {c.reason}" for c in cells if not c.works]
    return lines


def _demo_models_text(exp: Any) -> str:
    """The bundled models ``exp``'s demo runs on, by the checks the demo's plan makes (a
    model the experiment refuses is named apart, with the reason)."""
    from workbench.harness.sweeps.spec import bundled_refusal

    refused = {name: bundled_refusal(exp, name) for name in exp.demo_models}
    taken = [name for name, why in refused.items() if not why]
    text = ", ".join(taken) or "no bundled model"
    return text + "".join(f"; not {name}: {why}" for name, why in refused.items() if why)


def _own_defaults_lines(exp: Any, indent: str) -> list[str]:
    """The bundled models' own defaults (under every config, ``--set`` included)."""
    lines = []
    for model, overrides in exp.model_defaults.items():
        sets = " ".join(f"--set {k}={set_text(v)}" for k, v in overrides.items())
        lines += ["\n" + _fill(f"own defaults on {model} (under the demo config and --set; "
                               "see the experiment's page):", hanging=indent),
                  _fill(sets, indent=indent)]
    return lines


def experiment_help(name: str, root: Path) -> str:
    """``workbench run EXPERIMENT --help``: what the experiment asks, the models it takes,
    its config fields, its demo config, its tables and how long it took here.

    Raises:
        UnknownNameError: an unknown experiment (suggesting the closest).
    """
    from workbench.harness.experiment import get

    exp = get(name)
    demo = " ".join(f"--set {k}={set_text(v)}" for k, v in exp.demo.items()) or "(the default)"
    indent = "  "
    models = [_fill(line, hanging=indent) for line in _model_lines(exp)] if exp.needs_model \
        else ["model: no model (it trains its own)"]
    on = f", on {_demo_models_text(exp)}" if exp.needs_model else ""
    parts = [
        f"{exp.name} ({exp.module})",
        _fill(exp.description, indent=indent),
        "", *models,
        "\nconfig fields (--set FIELD=VALUE; a tuple is comma-separated, e.g. 1,2,8):",
        textwrap.indent(_fields_text(exp), indent),
        "\n" + _fill(f"demo config (workbench demo{on}):", hanging=indent),
        _fill(demo, indent=indent),
        *_own_defaults_lines(exp, indent),
        "\n" + _fill("tables: " + ", ".join(exp.tables or {}), hanging=indent),
        "\nwall time:",
        *(_fill(line, indent=indent, hanging=indent * 2) for line in _wall_time_lines(exp, root)),
    ]
    return "\n".join(parts)


def experiment_list() -> str:
    """The experiments, one wrapped paragraph each (``workbench run --help``)."""
    from workbench.harness.experiment import all_experiments

    lines = ["experiments (`workbench run EXPERIMENT --help` shows one in full):"]
    for exp in all_experiments():
        lines.append(_fill(f"{exp.name}: {exp.description}", indent="  ", hanging="      "))
    return "\n".join(lines)
