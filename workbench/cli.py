"""The ``workbench`` command line.

Every command that produces results creates a run and prints its folder as the last line
of its output. Run ``workbench --help`` or ``workbench COMMAND --help`` for the options.

:func:`main` is the one boundary between the library and the terminal. Whatever goes
wrong ends in a single line on stderr, ``error: ...``, and one of three exit statuses;
never a Python traceback unless ``-v`` asks for it (it is then printed above the line):

- **2, bad input**: the command as given cannot run. A usage error or an option out of
  range (``--limit``, ``--max-batch-tokens`` and ``--rows`` below 1, ``--port`` outside
  1..65535), a run store (``--out``, ``--runs``, ``WORKBENCH_RUNS_DIR``) that is not a
  folder or cannot be written, and every :class:`WorkbenchError` the library raises: an
  unknown name, a ``--set`` value of the wrong type or out of range, a malformed head
  mask, an unreadable ``--file``, a model that cannot do what an experiment needs. These
  are checked before a model loads or a run exists, so bad input leaves no run behind.
- **1, runtime failure**: the work started and the machine failed it: a full disk
  (ENOSPC), a read-only file system (EROFS), a permission denied or any other
  :class:`OSError`, text that is not valid UTF-8, out of memory. The line says what
  failed and where ("cannot write the run store /x: [Errno 28] No space left on
  device"); a run that had started is stored as ``failed`` with the cause. Any other
  exception is a bug and also exits 1, as ``error: internal error: <type>: <message>``.
- **130, interrupted**: Ctrl-C or SIGTERM; a run that had started is stored as failed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import sys
import textwrap
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, get_args

from workbench.core import paths, progress
from workbench.core.errors import WorkbenchError
from workbench.core.options import Dtype, PatternStorage, Status, StoreDtype

log = logging.getLogger("workbench")


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain fixed-width table."""
    body = [["" if r.get(c) is None else str(r.get(c)) for c in columns] for r in rows]
    cells = [[str(c) for c in columns], *body]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# ---- progress bars ------------------------------------------------------------------------

class _TqdmBars:
    """Draws :mod:`workbench.core.progress` bars with tqdm on stderr, one line per open bar,
    nested by depth (``position=``). Only an outermost stages bar stays (``leave=``) to show
    how long the whole run took; the others are cleared when they end."""

    def __init__(self) -> None:
        self._bars: dict[int, Any] = {}

    @staticmethod
    def logging() -> contextlib.AbstractContextManager[None]:
        """Log lines written above the bars instead of through them."""
        from tqdm.contrib.logging import logging_redirect_tqdm

        return logging_redirect_tqdm()

    @staticmethod
    def _label(bar: progress.Bar) -> str:
        if bar.steps and not bar.stage:
            return f"{bar.desc} [{bar.total} steps]"
        if bar.steps:
            step = min(bar.finished + 1, bar.total or bar.finished + 1)
            return f"{bar.desc} [step {step}/{bar.total}: {bar.stage}]"
        return bar.desc if bar.total is None else f"{bar.desc} {bar.finished}/{bar.total}"

    def open(self, bar: progress.Bar) -> None:
        from tqdm import tqdm

        # a bar's n is fractional (its inner bar's share), so the counts are in the label
        fmt = None if bar.total is None else (
            "{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
        self._bars[id(bar)] = tqdm(
            total=bar.total, desc=self._label(bar), position=bar.depth, bar_format=fmt,
            leave=bar.steps and bar.depth == 0, dynamic_ncols=True, file=sys.stderr,
            # a whole-run average: steps differ too much in length for a recent rate
            smoothing=0 if bar.steps else 0.3)

    def update(self, bar: progress.Bar) -> None:
        shown = self._bars.get(id(bar))
        if shown is None:
            return
        if shown.total != bar.total:
            shown.total = bar.total
        label = self._label(bar)
        # a new step is drawn at once; counts may wait for tqdm's next refresh
        new_step = bar.steps and label != shown.desc
        shown.set_description_str(label, refresh=False)
        shown.update(bar.n - shown.n)
        if new_step:
            shown.refresh()

    def close(self, bar: progress.Bar) -> None:
        shown = self._bars.pop(id(bar), None)
        if shown is not None:
            shown.close()


# ---- models -------------------------------------------------------------------------------

def cmd_models(args: argparse.Namespace) -> None:
    from workbench.models import zoo

    if getattr(args, "families", False):
        _family_matrix()
        return
    rows = []
    for name, spec in zoo.MODELS.items():
        rows.append({
            "name": name, "source": spec.source, "architecture": spec.architecture,
            "layers": spec.n_layers, "heads (q/kv)": f"{spec.n_heads}/{spec.n_kv_heads}",
            "d_model": spec.d_model, "context": spec.n_ctx, "positions": spec.positions,
            "cached": "yes" if zoo.is_cached(name) else "no",
        })
    _out(_table(rows, list(rows[0])))
    _out()
    for name, spec in zoo.MODELS.items():
        _out(f"{name}: {spec.title} ({spec.hub_id}). Use for: {spec.uses}.")
    _out(f"\ncache: {paths.cache_dir()}  (set WORKBENCH_CACHE to move it)")
    _out("also accepted as MODEL: a Hugging Face hub id (needs a network), a local model "
         "folder, a .gguf file, or <run-id>:<step> for a trained checkpoint")


def _family_matrix() -> None:
    """``models --families``: the family x experiment matrix, and why a cell is not plain."""
    from workbench.harness.matrix import family_matrix
    from workbench.models.adapters import FAMILIES

    cells = family_matrix()
    experiments = list(dict.fromkeys(c.experiment for c in cells))
    rows, notes = [], []
    for family, adapter in FAMILIES.items():
        row = {"family": family, "positions": adapter.positions, "q/k/v": adapter.layout}
        for c in (c for c in cells if c.family == family):
            row[c.experiment] = ("works" if c.works else "n/a") + ("*" if c.reason else "")
            if c.reason and (c.works or not adapter.unsupported):
                notes.append(f"{family} / {c.experiment}: {c.label}")
        if adapter.unsupported:
            notes.append(f"{family} / every experiment: n/a: {adapter.unsupported}")
        rows.append(row)
    _out(_table(rows, ["family", "positions", "q/k/v", *experiments]))
    _out()
    for note in notes:
        _out(f"* {note}")


def cmd_verify(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from workbench.harness.verify import damage_summary, verify

    checks = verify(args.names, runs_dir=args.out)
    _out(_table([asdict(c) for c in checks], ["name", "kind", "status", "detail"]))
    if (summary := damage_summary(checks)) is not None:
        sys.stderr.write(f"error: {summary}\n")
        sys.exit(1)


def cmd_fetch(args: argparse.Namespace) -> None:
    from workbench.models import zoo

    names = args.names or zoo.MODELS.names()
    for name in names:
        zoo.MODELS.get(name)  # fail on an unknown name before downloading anything
    for name in names:
        cached = zoo.is_cached(name) and not args.force
        path = zoo.fetch(name, force=args.force)
        _out(f"{name}: {'already cached, verified' if cached else 'fetched and verified'} "
             f"-> {path}")


# ---- record -------------------------------------------------------------------------------

def _prompt_source(args: argparse.Namespace) -> tuple[Callable[[Any], list[Any]], str]:
    """The prompts of ``record`` as a function of the model, and their source; text, files
    and prompt-set parameters are read and checked here, before the model loads."""
    from workbench.harness.config import split_overrides
    from workbench.inputs.prompts import check_prompt_params, load_prompt_set, prompts_from_text

    if args.set and args.prompt_set is None:
        raise WorkbenchError("--set sets parameters of a generated prompt set; it needs "
                             "--prompt-set NAME")
    if args.text is not None:
        if not args.text.strip():
            raise WorkbenchError("--text is empty")
        prompts = prompts_from_text(args.text, label="text")
        return lambda model: prompts, "text"
    if args.file is not None:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkbenchError(f"cannot read {args.file}: {exc}") from None
        prompts = prompts_from_text(text, label=Path(args.file).stem)
        return lambda model: prompts, f"file:{args.file}"
    name = args.prompt_set
    params = check_prompt_params(name, split_overrides(args.set or []))
    return lambda model: load_prompt_set(name, model, **params), f"prompt-set:{name}"


def _heads_mask(args: argparse.Namespace) -> Any:
    """The ``--heads-mask`` file, read and checked (before any model loads), or ``None``."""
    if not getattr(args, "heads_mask", None):
        return None
    from workbench.interventions.masks import HeadMask

    return HeadMask.load(args.heads_mask)


def cmd_record(args: argparse.Namespace) -> None:
    from workbench.interventions.masks import applied
    from workbench.models.load import load_model
    from workbench.recording.record import record
    from workbench.store.runs import RunStore

    mask = _heads_mask(args)
    make_prompts, source = _prompt_source(args)
    model = load_model(args.model, dtype=args.dtype, runs_dir=args.out)
    if mask is not None:
        mask.check(model)
    prompts = make_prompts(model)[: args.limit]
    for p in prompts:  # check every prompt before a run is created
        model.encode(p)
    config = {"source": source, "n_prompts": len(prompts), "store_dtype": args.store_dtype,
              "max_batch_tokens": args.max_batch_tokens, "dtype": args.dtype,
              "patterns": args.patterns, "topk": args.topk, "resid": not args.no_resid}
    store = RunStore(paths.runs_dir(args.out))
    interventions = {"heads_mask": mask.to_json()} if mask is not None else None
    with store.start("record", model.info.to_dict(), config,
                     extra={"interventions": interventions}) as run, applied(model, mask):
        rec = record(model, prompts, run.dir / "recording", store_dtype=args.store_dtype,
                     max_batch_tokens=args.max_batch_tokens, patterns=args.patterns,
                     topk=args.topk, include_resid=not args.no_resid)
        n_tokens = sum(len(p.token_ids) for p in rec.prompts)
        stored = f"top-{rec.topk}" if rec.patterns == "topk" else rec.patterns
        run.set("summary", [f"recorded {len(rec)} prompts, {n_tokens} tokens, "
                            f"{rec.n_layers} layers x {rec.n_heads} heads, {stored} patterns"])
    final = store.get(run.final)
    for line in final.meta["summary"]:
        _out(line)
    _out(str(final.path))


# ---- experiments and runs -----------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> None:
    from workbench.harness.experiment import run_experiment

    run = run_experiment(args.experiment, args.model, args.set or [], runs_dir=args.out,
                         dtype=args.dtype, reuse=args.reuse, heads_mask=_heads_mask(args))
    for line in run.meta.get("summary", []):
        _out(line)
    _out(str(run.path))


def cmd_experiments(args: argparse.Namespace) -> None:
    from workbench.harness.experiment import all_experiments

    for exp in all_experiments():
        _out(f"{exp.name}  ({exp.module})")
        _out(_fill(exp.description, indent="  "))
        _out(textwrap.indent(_fields_text(exp), "    "))
        _out(_fill("tables: " + ", ".join(exp.tables or {}), indent="  ", hanging="    "))
        _out()


def cmd_runs(args: argparse.Namespace) -> None:
    from workbench.harness.experiment import check_run_kind
    from workbench.store.runs import RunStore

    if args.experiment is not None:
        check_run_kind(args.experiment)
    store = RunStore(paths.runs_dir(args.out))
    runs = store.runs(experiment=args.experiment, model=args.model, status=args.status)
    if not runs:
        _out(f"no runs in {store.root}")
        return
    rows = [{"run": r.id, "experiment": r.experiment, "model": r.model_name or "-",
             "status": r.status, "started": r.meta.get("started_at", "")[:19]} for r in runs]
    _out(_table(rows, ["run", "experiment", "model", "status", "started"]))
    _out(f"\n{len(runs)} runs in {store.root}")


def cmd_show(args: argparse.Namespace) -> None:
    import json

    from workbench.store.runs import RunStore

    run = RunStore(paths.runs_dir(args.out)).get(args.run)
    if args.table and run.status != "damaged" and args.table not in run.table_names():
        from workbench.core.errors import UnknownNameError
        from workbench.core.registry import did_you_mean

        known = run.table_names()  # refused before anything is printed
        raise UnknownNameError(f"run {run.id} has no table '{args.table}'"
                               f"{did_you_mean(args.table, known)}; its tables: "
                               f"{', '.join(known) or 'none'}")
    meta = run.meta
    model = meta.get("model") or {}
    _out(f"run        {run.id}")
    _out(f"experiment {run.experiment}")
    _out(f"model      {model.get('name', '-')}  ({model.get('source', '-')}, "
         f"sha256 {str(model.get('checksum', ''))[:16] or '-'})")
    _out(f"status     {run.status}  ({meta.get('started_at')} -> {meta.get('ended_at', '...')})")
    if meta.get("error"):
        _out(f"error      {meta['error']}")
    git = meta.get("git") or {}
    _out(f"code       workbench {meta.get('workbench_version')}, git "
         f"{(git.get('commit') or '-')[:12]}{' (dirty)' if git.get('dirty') else ''}")
    _out("config     " + json.dumps(meta.get("config", {}), sort_keys=True))
    for line in meta.get("summary", []):
        _out(f"summary    {line}")
    for name, entry in sorted(meta.get("tables", {}).items()):
        _out(f"table      {name} ({entry['rows']} rows)")
    if (run.path / "recording").is_dir():
        _out("recording  recording/ (open with workbench.recording.Recording.open)")
    if args.table:
        import pandas as pd

        with pd.option_context("display.width", 120, "display.max_columns", 20):
            _out(run.table(args.table).head(args.rows).to_string(index=False))
    _out(str(run.path))


def cmd_demo(args: argparse.Namespace) -> None:
    from workbench.harness.demo import run_demo

    models = [m.strip() for m in args.models.split(",") if m.strip()] \
        if args.models is not None else None
    for line in run_demo(models, args.out, fresh=args.fresh):
        _out(line)
    _out(str(paths.runs_dir(args.out)))


def cmd_sweep(args: argparse.Namespace) -> None:
    from workbench.harness import sweep

    if not args.dry_run:
        from workbench.harness.sweep_ray import import_ray

        import_ray()  # without Ray, say so before reading anything
    spec, cells = sweep.plan(args.spec, args.out)
    if args.dry_run:
        _sweep_plan(spec, cells, args)
        return
    with _sweep_bar(len(cells), args.quiet) as show:
        run = sweep.run_sweep(spec, cells, runs_dir=args.out, cpus=args.cpus, gpus=args.gpus,
                              address=args.address, dtype=args.dtype, on_progress=show)
    for line in run.meta.get("summary", []):
        _out(line)
    _out(str(run.path))
    bad = sweep.failed_cells(run)
    if len(bad):
        first = bad.iloc[0]
        sys.stderr.write(f"error: {len(bad)} of {len(cells)} cells did not complete (cell "
                         f"{first.cell}: {first.status}: {_one_line(first.error)[:200]}); "
                         "run the sweep again to retry them\n")
        sys.exit(1)


def _sweep_plan(spec: Any, cells: Sequence[Any], args: argparse.Namespace) -> None:
    """``--dry-run``: the cells, whether each is reused, and a cost estimate."""
    from workbench.harness import sweep
    from workbench.store.runs import RunStore

    store = RunStore(paths.runs_dir(args.out))
    reused = sweep.reusable(cells, store)
    cost = sweep.estimate(cells, store, reused)
    rows = [{"cell": c.index, "experiment": c.experiment,
             "model": c.model.name if c.model else "-",
             "values": " ".join(f"{k}={v}" for k, v in c.grid.items()),
             "plan": f"reuse {reused[c.index].id}" if c.index in reused else "run",
             "estimate": "-" if cost.seconds[c.index] is None
             else _duration(cost.seconds[c.index])} for c in cells]
    _out(_table(rows, ["cell", "experiment", "model", "values", "plan", "estimate"]))
    slots = sweep.local_slots(args.cpus)
    _out(f"\n{spec.name}: {len(cells)} cells, {len(reused)} reused")
    if cost.unknown == len(cells) - len(reused) and cost.unknown:
        _out("estimate: no estimate (no earlier run of these experiments on these models)")
        return
    unknown = f"; {cost.unknown} cells have no earlier run to go by" if cost.unknown else ""
    _out(f"estimate: {_duration(cost.known)} of cell time, about "
         f"{_duration(cost.known / slots)} on {slots} local workers of {args.cpus} CPUs "
         f"(model loading and Ray start-up not included){unknown}")


@contextlib.contextmanager
def _sweep_bar(total: int, quiet: bool) -> Any:
    """A tqdm bar of a sweep's cells: done, running, failed, time left."""
    if quiet:
        yield lambda p: None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc="cells", dynamic_ncols=True, file=sys.stderr, smoothing=0)

    def show(p: Any) -> None:
        bar.set_postfix_str(f"{p.done} done, {p.running} running, {p.failed} failed",
                            refresh=False)
        bar.update(p.done + p.failed - bar.n)

    try:
        yield show
    finally:
        bar.close()


def cmd_reproduce(args: argparse.Namespace) -> None:
    from workbench.harness import claims as claims_mod
    from workbench.store.runs import RunStore

    selected = claims_mod.select(claims_mod.load_claims(), args.claims or [])
    store = RunStore(paths.runs_dir(args.out))
    if args.list:
        _claim_list(selected, _last_verdicts(store), wide=args.wide)
        _out(_fill(f"verdict: the newest in {store.root} ('-': not checked there); "
                   "`--wide` shows each claim in full"))
        return
    run = claims_mod.reproduce_run(store, selected, model=args.model, fresh=args.fresh)
    table = run.table("claims")
    judged = table.verdict.isin(["pass", "fail", "undecided"])
    table = table.assign(measured=table.measured.where(judged, table.reason))
    for kind, title in (("reproduction", "Reproductions"), ("invariant", "Invariants")):
        group = table[table.kind == kind]
        _out(f"== {title} (a paper's findings) ==" if kind == "reproduction"
             else f"== {title} (mathematical properties, not counted as findings) ==")
        for row in group.to_dict("records"):
            _reproduce_row(row)
        _out(f"{title}: {claims_mod.counts(group.verdict)}")
        _out()
    _out(str(run.path))


def _last_verdicts(store: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The newest stored verdict of each (claim, model), from the complete ``reproduce``
    runs in the store (none if it holds none)."""
    if not store.root.is_dir():
        return {}
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for run in reversed(store.runs(experiment="reproduce", status="complete")):
        with contextlib.suppress(WorkbenchError, OSError):  # a damaged table: older ones
            for row in run.table("claims").to_dict("records"):
                found.setdefault((row["claim"], row["model"]), {**row, "run": run.id})
    return found


_WIDE_FIELDS = ("source", "quote", "published", "applies_to", "experiment", "config", "check",
                "file")
"""What ``reproduce --list --wide`` adds under each claim."""


def _claim_list(selected: Sequence[Any], last: dict[tuple[str, str], dict[str, Any]], *,
                wide: bool) -> None:
    """``reproduce --list``: id, kind, model and last verdict, then the statement on its
    own lines; ``--wide`` adds every field of the claim and what was last measured."""
    indent = " " * 4
    per_claim = [[{"claim": c.id, "kind": c.kind, "model": m,
                   "verdict": last.get((c.id, m), {}).get("verdict", "-")}
                  for m in (c.models or ("-",))] for c in selected]
    lines = iter(_table([r for rows in per_claim for r in rows],
                        ["claim", "kind", "model", "verdict"]).splitlines())
    _out(next(lines))  # the header, and its rule
    _out(next(lines))
    for c, rows in zip(selected, per_claim, strict=True):
        for _ in rows:
            _out(next(lines))
        _out(_fill(c.statement, indent=indent))
        if not wide:
            continue
        for name in _WIDE_FIELDS:
            value = getattr(c, name)
            if value not in ("", None, (), {}):
                text = ", ".join(value) if isinstance(value, tuple) else str(value)
                _out(_fill(f"{name}: {text}", indent=indent, hanging=indent * 2))
        for row in rows:
            seen = last.get((c.id, row["model"]))
            if seen is not None:
                measured = seen["measured"] or seen["reason"]
                _out(_fill(f"last on {row['model']}: {seen['verdict']}, {measured} "
                           f"(run {seen['run']})", indent=indent, hanging=indent * 2))
        _out()


def _reproduce_row(row: dict[str, Any]) -> None:
    _out(f"{row['verdict'].upper():9s} {row['claim']}  [{row['model']}]")
    for label in ("source", "published", "measured"):
        _out(textwrap.indent(textwrap.fill(f"{label}: {row[label]}", 96), " " * 10))


def cmd_dashboard(args: argparse.Namespace) -> None:
    from dashboards.app import check_host, create_app, serve

    check_host(args.host, args.debug)  # refuses --debug off loopback before anything is built
    runs = paths.runs_dir(args.runs)
    app = create_app(runs)
    _out(f"serving runs from {runs} at http://{args.host}:{args.port}/  (Ctrl-C stops)")
    serve(app, args.host, args.port, args.debug)  # warns when the host is not loopback


def cmd_prompts(args: argparse.Namespace) -> None:
    from workbench.inputs.prompts import GENERATORS, file_sets

    for name, path in file_sets().items():
        _out(f"{name:18s} file {path}")
    for name, fn in GENERATORS.items():
        # the docstring's whole first paragraph, wrapped: its first line may end mid-sentence
        doc = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        _out(_fill(f"{name:18s} generated: {doc}", hanging=" " * 19))


# ---- experiment help ----------------------------------------------------------------------

_WIDTH = 100
"""Help and listings wrap at this width."""


def _fill(text: str, width: int = _WIDTH, indent: str = "", hanging: str | None = None) -> str:
    """``text`` wrapped at spaces only, so ids and hyphenated words stay whole (and
    searchable)."""
    return textwrap.fill(text, width, initial_indent=indent,
                         subsequent_indent=indent if hanging is None else hanging,
                         break_on_hyphens=False, break_long_words=False)


def _wrapped_table(rows: Sequence[dict[str, Any]], columns: Sequence[str],
                   width: int = _WIDTH) -> str:
    """:func:`_table` whose last column (a description) wraps instead of running on; when
    the other columns leave it under 40 characters, it goes on the lines below its row."""
    cells = [[str(c) for c in columns],
             *[["" if r.get(c) is None else str(r.get(c)) for c in columns] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns) - 1)]
    room = width - sum(widths) - 2 * len(widths)
    if room < 40:
        lines = _table([dict(zip(columns[:-1], row[:-1], strict=True)) for row in cells[1:]],
                       columns[:-1]).splitlines()
        out = lines[:2]
        for line, row in zip(lines[2:], cells[1:], strict=True):
            out += [line, *textwrap.wrap(row[-1], width, initial_indent="    ",
                                         subsequent_indent="    ", break_on_hyphens=False)]
        return "\n".join(out)
    lines = []
    for i, row in enumerate(cells):
        for k, part in enumerate(textwrap.wrap(row[-1], room, break_on_hyphens=False) or [""]):
            lead = row[:-1] if k == 0 else [""] * len(widths)
            lines.append("  ".join([*(v.ljust(w) for v, w in zip(lead, widths, strict=True)),
                                    part]).rstrip())
        if i == 0:
            longest = min(room, max(len(row[-1]) for row in cells))
            lines.append("  ".join("-" * w for w in [*widths, longest]))
    return "\n".join(lines)


def _set_text(value: Any) -> str:
    """A value as ``--set`` takes it: ``1,2,8``, ``true``, ``none``; ``(empty)`` for an
    empty tuple (``--set name=``)."""
    if isinstance(value, (tuple, list)):
        return ",".join(_set_text(v) for v in value) or "(empty)"
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else str(value)


def _fields_text(exp: Any) -> str:
    from workbench.harness import config

    rows = [{"field": f.name, "type": f.type, "default": _set_text(f.default),
             "range": f.range, "help": f.help} for f in config.fields(exp.config)]
    return _wrapped_table(rows, ["field", "type", "default", "range", "help"], _WIDTH - 4)


def _duration(seconds: float) -> str:
    if seconds < 1:  # run.json keeps whole seconds
        return "under 1 s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def _wall_time_lines(exp: Any, root: Path) -> list[str]:
    """How long the default and demo configs took here, from the stored runs."""
    from workbench.harness.timing import wall_times
    from workbench.store.runs import RunStore

    times = wall_times(exp, RunStore(root)) if root.is_dir() else []
    if not times:
        return [f"no complete run of its default or demo config in {root} to time; the "
                "README's Experiments section gives the wall times measured on 2 cores"]
    lines = [f"from the newest complete runs in {root} (start to end of each run; the model "
             "had loaded before):"]
    for t in times:
        model = "its own models" if t.model == "-" else t.model
        cores = f", {t.cpu_count} cores" if t.cpu_count else ""
        lines.append(f"{t.config} on {model}: {_duration(t.seconds)} "
                     f"({t.ended_at[:16].replace('T', ' ')}{cores}; run {t.run_id})")
    return lines


_NEEDS = {"any": "any model", "causal": "a causal (left-to-right) model",
          "causal_lm": "a causal language model with a trained LM head"}


def experiment_help(name: str, root: Path) -> str:
    """``workbench run EXPERIMENT --help``: what the experiment asks, the models it takes,
    its config fields, its demo config, its tables and how long it took here.

    Raises:
        UnknownNameError: an unknown experiment (suggesting the closest).
    """
    from workbench.harness.experiment import get

    exp = get(name)
    demo = " ".join(f"--set {k}={_set_text(v)}" for k, v in exp.demo.items()) or "(the default)"
    model = _NEEDS[exp.requires] if exp.needs_model else "no model (it trains its own)"
    indent = "  "
    parts = [
        f"{exp.name} ({exp.module})",
        _fill(exp.description, indent=indent),
        f"\nmodel: {model}",
        "\nconfig fields (--set FIELD=VALUE; a tuple is comma-separated, e.g. 1,2,8):",
        textwrap.indent(_fields_text(exp), indent),
        f"\ndemo config (workbench demo, on {', '.join(exp.demo_models)}):",
        _fill(demo, indent=indent),
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


class _RunHelp(argparse.Action):
    """``-h/--help`` of ``run``: the options and the experiments; after an experiment's
    name (``run induction-heads --help``), that experiment in full."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        name = getattr(namespace, "experiment", None)
        try:
            text = (experiment_help(name, paths.runs_dir(getattr(namespace, "out", None)))
                    if name else parser.format_help() + "\n" + experiment_list())
        except WorkbenchError as exc:
            parser.error(str(exc))
        _out(text)
        parser.exit()


# ---- argument parsing ---------------------------------------------------------------------

Subparsers = Any  # argparse's private _SubParsersAction


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, ``error: ...``, exit status 2, like all bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _port(text: str) -> int:
    """An argparse type: a TCP port, 1..65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 1..65535, got {value}")
    return value


def _add(sub: Subparsers, name: str, fn: Any, help: str,
         **kwargs: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help, **kwargs)
    p.set_defaults(fn=fn, store=None)
    return p


def _out_option(p: argparse.ArgumentParser, store: str = "write") -> None:
    """``--out``; ``store`` says whether the command writes the run store or only reads
    it (checked by :func:`_check_store` before the command starts)."""
    p.add_argument("--out", metavar="DIR", help="run store (default: $WORKBENCH_RUNS_DIR "
                   "or data/runs)")
    p.set_defaults(store=store)


def _dtype_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="float32", choices=get_args(Dtype),
                   help="model parameter dtype (default float32)")


def _mask_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--heads-mask", metavar="FILE", help="apply a head mask (JSON, see "
                   "workbench.interventions) to every forward pass")


def _add_model_commands(sub: Subparsers) -> None:
    p = _add(sub, "models", cmd_models, "list the model zoo")
    p.add_argument("--families", action="store_true", help="instead: which experiment works "
                   "on which model family (from the architecture adapters), and why not")
    p = _add(sub, "fetch", cmd_fetch, "fetch bundled models into the cache, verifying SHA-256")
    p.add_argument("names", nargs="*", metavar="NAME", help="models to fetch (default: all)")
    p.add_argument("--force", action="store_true", help="fetch again even if cached")
    p = _add(sub, "verify", cmd_verify, "re-hash what is stored: cached bundled models, runs "
             "(tables, recordings, checkpoints) and recording folders; exit 1 if any is damaged")
    p.add_argument("names", nargs="*", metavar="NAME", help="a bundled model, a run id (or "
                   "unique prefix) or a recording folder (default: every bundled model and "
                   "every run in the store)")
    _out_option(p, store="read")
    _add(sub, "prompts", cmd_prompts, "list named prompt sets")


def _add_record_command(sub: Subparsers) -> None:
    p = _add(sub, "record", cmd_record, "record residual streams and attention patterns to disk")
    p.add_argument("model", metavar="MODEL", help="bundled name (`workbench models`), hub id, "
                   "model folder, .gguf file or <run-id>/L<n>:<step>")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="a prompt (blank lines separate several)")
    src.add_argument("--file", metavar="PATH", help="a UTF-8 text file; blank lines separate "
                     "prompts")
    src.add_argument("--prompt-set", metavar="NAME", help="a named prompt set "
                     "(`workbench prompts` lists them)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="parameter of a generated prompt set, e.g. seq_len=64")
    p.add_argument("--limit", type=_at_least_one, metavar="N",
                   help="record only the first N prompts")
    p.add_argument("--store-dtype", default="float16", choices=get_args(StoreDtype),
                   help="storage dtype (float16 falls back to float32 per block on overflow)")
    p.add_argument("--max-batch-tokens", type=_at_least_one, default=2048, metavar="N",
                   help="tokens per forward batch (default 2048)")
    p.add_argument("--patterns", default="auto", choices=get_args(PatternStorage),
                   help="how patterns are stored: every weight (dense), the k largest per "
                   "query row plus exact first-token, diagonal, previous-token and left-out "
                   "weights (topk), or not at all (none); default auto: dense up to 1,024 "
                   "tokens, topk above")
    p.add_argument("--topk", type=_at_least_one, default=16, metavar="K",
                   help="weights kept per query row with topk patterns (default 16)")
    p.add_argument("--no-resid", action="store_true",
                   help="leave out the residual stream (270 MB for one 8,192-token smollm2 "
                   "prompt)")
    _mask_option(p)
    _dtype_option(p)
    _out_option(p)


def _add_experiment_commands(sub: Subparsers) -> None:
    p = _add(sub, "run", cmd_run, "run an experiment and store it as a run", add_help=False)
    p.add_argument("-h", "--help", action=_RunHelp, help="show this help and the experiments; "
                   "after EXPERIMENT, its config fields, demo config and wall time")
    p.add_argument("experiment", metavar="EXPERIMENT",
                   help="an experiment name (`workbench experiments` lists them and their fields)")
    p.add_argument("--model", metavar="MODEL", help="model name, hub id, folder or .gguf")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config field (repeatable); see `workbench experiments`")
    p.add_argument("--reuse", action="store_true",
                   help="return a matching complete run instead of running again")
    _mask_option(p)
    _dtype_option(p)
    _out_option(p)
    _add(sub, "experiments", cmd_experiments, "list experiments, their config fields and tables")
    p = _add(sub, "demo", cmd_demo,
             "run every experiment's demo configuration on the bundled models")
    p.add_argument("--models", metavar="M1,M2", help="only these bundled models (comma-"
                   "separated): their experiments and the claims about them, no training "
                   "(default: smollm2 and minilm, the training and every claim)")
    p.add_argument("--fresh", action="store_true", help="do not reuse matching runs")
    _out_option(p)
    p = _add(sub, "sweep", cmd_sweep, "run a sweep spec (experiments x models x checkpoints "
             "x seeds x configs) on Ray, resumably")
    p.add_argument("spec", metavar="SPEC", help="a TOML sweep spec (see data/sweeps/)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the cells and a cost estimate from earlier runs; run nothing")
    p.add_argument("--cpus", type=_at_least_one, default=1, metavar="N",
                   help="CPUs per cell, also its torch threads (default 1: one cell per core)")
    p.add_argument("--gpus", type=float, default=0, metavar="N", help="GPUs per cell "
                   "(default 0; with any, models load on cuda)")
    p.add_argument("--address", metavar="auto|ray://HOST:PORT", help="join a running Ray "
                   "cluster (default: start a local one); the run store must be a path "
                   "every node sees")
    _dtype_option(p)
    _out_option(p)
    p = _add(sub, "reproduce", cmd_reproduce, "check published claims against measured results")
    p.add_argument("claims", nargs="*", metavar="CLAIM_ID", help="claims to check (default: all)")
    p.add_argument("--model", help="check every claim that applies to this model instead of "
                   "each claim's default models")
    p.add_argument("--fresh", action="store_true", help="run again instead of reusing runs")
    p.add_argument("--list", action="store_true", help="list the claims without running: id, "
                   "kind, model, the last stored verdict, and the statement")
    p.add_argument("--wide", action="store_true", help="with --list: also each claim's source, "
                   "quote, published figure, experiment, config, check and last measurement")
    _out_option(p)


def _add_store_commands(sub: Subparsers) -> None:
    p = _add(sub, "runs", cmd_runs, "list stored runs")
    p.add_argument("--experiment", help="only this experiment")
    p.add_argument("--model", help="only this model")
    p.add_argument("--status", choices=get_args(Status))
    _out_option(p, store="read")
    p = _add(sub, "show", cmd_show, "summarise one run")
    p.add_argument("run", metavar="RUN", help="run id, unique id prefix, or folder")
    p.add_argument("--table", help="also print the first rows of this table")
    p.add_argument("--rows", type=_at_least_one, default=20, help="rows of --table to print")
    _out_option(p, store="read")
    p = _add(sub, "dashboard", cmd_dashboard, "serve the dashboard")
    p.add_argument("--runs", metavar="DIR", help="run store to show (default as --out)")
    p.set_defaults(store="read")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1; "
                   "another host makes the runs readable to the network)")
    p.add_argument("--port", type=_port, default=8050, help="TCP port, 1..65535 (default 8050)")
    p.add_argument("--debug", action="store_true", help="Dash debug mode: hot reload and the "
                   "interactive debugger (loopback --host only)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="workbench",
        description="Record, score and intervene on the attention heads of real transformers.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and the traceback of an error")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars or logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_model_commands(sub)
    _add_record_command(sub)
    _add_experiment_commands(sub)
    _add_store_commands(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that it unwinds like Ctrl-C (a running run
    is stored as failed) and exits 130."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(f"terminated by signal {signum}")


# ---- the boundary: every failure as one line and an exit status ---------------------------

_WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG}
"""Errors of writing: the line names the place written (the run store, the model cache)."""


def _store_root(args: argparse.Namespace) -> tuple[Path, str]:
    """The run store the command uses, and where that choice came from."""
    given = getattr(args, "runs", None) if args.command == "dashboard" else getattr(
        args, "out", None)
    if given is not None:
        origin = "--runs" if args.command == "dashboard" else "--out"
    else:
        origin = "WORKBENCH_RUNS_DIR" if os.environ.get("WORKBENCH_RUNS_DIR") else "default"
    return paths.runs_dir(given), origin


def _check_store(args: argparse.Namespace) -> None:
    """Refuse a run store that is not a folder, or cannot be written by a command that
    writes one, before anything else happens (before a model loads)."""
    mode = args.store
    if mode is None:
        return
    if getattr(args, "list", False):
        mode = "read"  # reproduce --list only reads
    root, origin = _store_root(args)
    existing = next(p for p in (root, *root.parents) if p.exists())
    if not existing.is_dir():
        where = "" if existing == root else f": {existing} is a file"
        raise WorkbenchError(f"the run store {root} ({origin}) is not a folder{where}")
    if mode != "write":
        return
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise WorkbenchError(f"cannot write the run store {root} ({origin}): {existing} is on "
                             f"a read-only file system")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise WorkbenchError(f"cannot write the run store {root} ({origin}): no permission "
                             f"to write in {existing}")


def _inside(path: str, folder: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


def _filename(value: Any) -> str | None:
    return os.fsdecode(value) if isinstance(value, (str, bytes, os.PathLike)) else None


def _os_error_line(exc: OSError, args: argparse.Namespace) -> str:
    """What failed and where: ``cannot write the run store /x: [Errno 28] No space left
    on device``, with the file when the error names one."""
    reason = (f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None and exc.strerror
              else str(exc) or type(exc).__name__)
    places = [(paths.cache_dir(), f"the model cache {paths.cache_dir()}")]
    if args.store is not None:
        root, _ = _store_root(args)
        places.insert(0, (root, f"the run store {root}"))
    name, other = _filename(exc.filename), _filename(exc.filename2)
    verb = "cannot write" if exc.errno in _WRITE_ERRNOS else "cannot use"
    if name is None:
        if exc.errno not in _WRITE_ERRNOS:
            return reason
        # a writer library's error names no file: the place this command writes
        return f"{verb} {places[-1 if args.command == 'fetch' else 0][1]}: {reason}"
    files = name if other is None else f"{name} -> {other}"
    place = next((label for folder, label in places if _inside(name, folder)), None)
    return f"{verb} {place}: {reason} ({files})" if place else f"{verb} {files}: {reason}"


def _failure(exc: BaseException, args: argparse.Namespace) -> tuple[str, int]:
    """The one line (without ``error: ``) and the exit status for ``exc``."""
    if isinstance(exc, WorkbenchError):
        return str(exc), 2
    if isinstance(exc, KeyboardInterrupt):
        return ("terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"), 130
    if isinstance(exc, OSError):
        return _os_error_line(exc, args), 1
    if isinstance(exc, UnicodeDecodeError):
        return (f"cannot decode text as {exc.encoding}: {exc.reason} at byte {exc.start}; "
                f"expected UTF-8 text"), 1
    if isinstance(exc, UnicodeEncodeError):  # e.g. printing to a terminal that is not UTF-8
        return (f"cannot encode text as {exc.encoding}: {exc.reason}; set a UTF-8 locale "
                f"(PYTHONIOENCODING=utf-8)"), 1
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":  # torch's
        return f"out of memory{f': {exc}' if str(exc) else ''}", 1
    hint = "" if args.verbose else " (run with -v for the traceback)"
    return f"internal error: {type(exc).__name__}: {exc}{hint}", 1


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _report(exc: BaseException, args: argparse.Namespace) -> int:
    """Write ``exc`` to stderr as one ``error:`` line (the traceback first with ``-v``)."""
    line, status = _failure(exc, args)
    if args.verbose and not isinstance(exc, KeyboardInterrupt):
        traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.write(f"error: {_one_line(line)}\n")
    sys.stderr.flush()
    return status


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line; exits with status 2 (bad input), 1 (runtime failure or
    internal error) or 130 (interrupted) after a one-line ``error: ...``."""
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "transformer_lens", "httpx", "urllib3", "werkzeug", "ray"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    progress.render_with(None if args.quiet else _TqdmBars())
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        _check_store(args)
        with _TqdmBars.logging() if not args.quiet else contextlib.nullcontext():
            args.fn(args)
    except BrokenPipeError:
        # stdout closed early (`workbench runs | head`): nothing more to say, and no
        # second error when Python flushes stdout at exit
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except (Exception, KeyboardInterrupt) as exc:  # the one boundary: see the docstring
        sys.exit(_report(exc, args))
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
