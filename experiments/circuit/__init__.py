"""Circuit: which edges between heads and MLPs carry a task, found by edge attribution
patching, and how faithful the circuits of each size are.

Edge attribution patching, EAP (Syed et al. 2023, "Attribution Patching Outperforms
Automated Circuit Discovery"), scores every edge of the graph of heads and MLPs
(:mod:`workbench.interventions.circuits`) from two forward passes and one backward:
the gradient of the metric at the receiver's input times the sender's clean minus
corrupted output, summed over positions, averaged over prompts. EAP-IG (Hanna et al. 2024,
"Have Faith in Faithfulness") averages the gradient over ``steps`` points between the
corrupted and the clean input embeddings. A circuit is the top ``ceil(f * E)`` edges by
``|score|``; its faithfulness (Mueller et al. 2025, MIB) is ``(m(C) - m(empty)) / (m(full) -
m(empty))`` with every edge outside it ablated (to its corrupted output, or to its mean
over the clean prompts: ``ablation``), with a bootstrap interval over prompts; CPR and CMD
are MIB's areas under the curve and between it and 1. The ``n_exact`` top edges are also
patched exactly, one run each, and the rank correlation (Spearman) of their scores with
their exact effects is reported, whatever it is.

Tasks:

- ``ioi``: Wang et al.'s IOI prompts (the first ``templates``) against their ABC corruption
  (IO, S1 and S2 replaced by three other names); the metric is ``logit(IO) - logit(S)`` at
  the last position;
- ``induction``: ``[BOS] A A`` against ``[BOS] A B`` (``seq_len`` random tokens each); the
  metric is the mean log-probability of A's tokens over the second repeat (the negative
  loss there);
- ``greater-than`` (Hanna et al. 2023, "How does GPT-2 compute greater-than?"): "The war
  lasted from the year 17YY to the year 17" (:mod:`workbench.inputs.greater_than`: a noun
  and a start year YY in 02..98 drawn with the seed) against the same prompt from the year
  1701; the metric is the probability of the years after YY minus that of the years up to
  it, at the last position. It needs a tokenizer that writes each year YY as one token
  after " 17": a model whose tokenizer does not is refused before its weights load;
- ``retrieval``: a document of ``doc_tokens`` tokens (:mod:`workbench.inputs.retrieval`:
  "The passcode for the KEY is VALUE." after BOS, filler prose of the Python documentation,
  then "The passcode for the KEY is"), a key and a value drawn with the seed, against the
  same document planting another value; the metric is ``logit(VALUE) - logit(OTHER)`` at
  the last position. ``depth`` in ``[0, 1)`` plants the line after that fraction of the
  filler instead (0, the default: right after BOS), to ask how the circuit changes with
  the pair's distance from the question. ``doc_tokens`` beyond the model's context is
  refused before the model loads where its context is known then (a bundled model), else
  before a run exists; a depth outside ``[0, 1)`` with the config.

An encoder (no next token to read a metric from) is refused before its weights load
where its config says what it is (a bundled model, a local folder).

``classes_from`` names stored runs (comma-separated) whose head classes the circuit's heads
are compared with (:mod:`experiments.circuit.classes`): ``head_classes`` of the head-scoring
experiments, the ``classes`` of ``ioi``. A run that is missing, not complete, on another
model or without head classes is refused before the model loads.

Tables: ``edges`` (every edge's score, rank and, for the top ``n_exact``, its exact
effect), ``nodes`` (each node's summed scores), ``faithfulness`` (the curve with its
intervals), ``scores`` (CPR, CMD, the rank correlation, the clean, empty and corrupted
metrics: the empty circuit's metric is the corrupted run's under corrupted ablation) and,
with ``classes_from``, ``class_overlap`` (each stored class's size, its overlap with the
circuit's heads, the overlap expected by chance and its hypergeometric p-value). Two
per-prompt tables, a prompt being a clean input and its corrupted twin, let ``workbench
compare`` pair two runs prompt by prompt: ``metric_by_prompt`` (each prompt's clean,
empty-circuit and corrupted metric, which ``scores`` averages) and
``faithfulness_by_prompt`` (each prompt's metric with each circuit of the curve kept: the
``m(C)`` whose mean over prompts the faithfulness is made of).

Example:
    workbench run circuit --model smollm2 --set task=ioi --set n_prompts=16
    python -m experiments.circuit --model smollm2 --set task=induction --set method=eap
    workbench run circuit --model smollm2 --set task=retrieval --set doc_tokens=2048
    workbench run circuit --model smollm2 --set task=retrieval --set depth=0.5
    workbench run circuit --model smollm2 --set classes_from=RUN_ID,OTHER_RUN_ID
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd
import torch

from experiments.circuit import checks  # noqa: F401 (registers the claim checks)
from experiments.circuit.classes import overlap_lines, overlap_table, parse_runs
from experiments.circuit.measure import (
    circuit_heads,
    edges_table,
    faithfulness_by_prompt_table,
    faithfulness_table,
    greater_than_task,
    induction_task,
    ioi_task,
    metric_by_prompt_table,
    nodes_table,
    prompt_digests,
    retrieval_task,
    scores_table,
)
from experiments.circuit.tables import TABLES
from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.core.options import AttentionPath
from workbench.core.values import MAX_PROMPTS, MAX_SEQUENCE
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.harness.run_classes import class_runs
from workbench.inputs.greater_than import year_tokens
from workbench.inputs.ioi import TEMPLATES
from workbench.inputs.retrieval import check_doc_tokens
from workbench.interventions.circuits.ablate import Ablation, edge_patching
from workbench.interventions.circuits.attribution import LowMemory, Method, edge_scores
from workbench.interventions.circuits.faithfulness import (
    MIB_FRACTIONS,
    Curve,
    faithfulness_curve,
)
from workbench.interventions.circuits.flow import metric_values
from workbench.interventions.circuits.graph import build_graph, require_graph
from workbench.interventions.circuits.task import Task, check_fractions
from workbench.models.base import Model, require
from workbench.models.load import load_facts, load_tokenizer
from workbench.store.runs import Run, RunStore

TaskName = Literal["ioi", "induction", "greater-than", "retrieval"]


@dataclass(frozen=True)
class Config:
    task: TaskName = param("ioi", "the task: ioi (logit difference IO - S), induction "
                           "(log-probability over the second repeat of random tokens) or "
                           "greater-than (probability of the years above the start year "
                           "minus those up to it) or retrieval (logit difference of the "
                           "value planted at a long document's start over another value, "
                           "asked for at its end)")
    method: Method = param("eap-ig", "edge scores: eap, or eap-ig (Hanna et al. 2024)")
    steps: int = param(5, "EAP-IG's m, points between the corrupted and clean inputs",
                       min=1, max=1000)
    n_prompts: int = param(32, "prompts", min=2, max=MAX_PROMPTS)
    templates: int = param(len(TEMPLATES), "ioi: the first N templates", min=1,
                           max=len(TEMPLATES))
    names: str = param("auto", "ioi: candidate names ('auto': workbench.inputs.ioi.NAMES), "
                       "filtered to single tokens")
    places: str = param("auto", "ioi: candidate places ('auto': workbench.inputs.ioi.PLACES)")
    objects: str = param("auto", "ioi: candidate objects ('auto': "
                         "workbench.inputs.ioi.OBJECTS)")
    nouns: str = param("auto", "greater-than: the nouns drawn ('auto': "
                       "workbench.inputs.greater_than.NOUNS)")
    doc_tokens: int = param(512, "retrieval: each document's length in tokens, BOS "
                            "included, at most the model's context", min=32,
                            max=MAX_SEQUENCE)
    keys: str = param("auto", "retrieval: candidate keys ('auto': "
                      "workbench.inputs.retrieval.KEYS), filtered to single tokens")
    values: str = param("auto", "retrieval: candidate values ('auto': "
                        "workbench.inputs.retrieval.VALUES), filtered to single tokens")
    depth: float = param(0.0, "retrieval: the fraction of the filler before the planted "
                         "line, in [0, 1); 0: right after BOS", min=0.0, max=1.0)
    classes_from: str = param("", "runs (comma-separated ids) whose stored head classes the "
                              "circuit's heads are compared with; empty: none")
    seq_len: int = param(16, "induction: random tokens in each repeat", min=2, max=4096)
    fractions: tuple[float, ...] = param((), "circuit sizes, fractions of the edges in "
                                         "(0, 1]; empty: MIB's ten, 0.001 to 1", min=0.0,
                                         max=1.0)
    ablation: Ablation = param("corrupted", "what an edge outside a circuit carries: its "
                               "corrupted output, or its mean over the clean prompts")
    n_exact: int = param(20, "top edges patched exactly, one run each", min=0, max=10000)
    level: float = param(0.8, "the faithfulness the summary's smallest circuit reaches",
                         min=0.0, max=1.0)
    attention: AttentionPath = param("auto", "attention path (blocked: no [head, T, T] "
                                     "tensor in the forward or the backward pass; auto: "
                                     "blocked where the family has it)")
    low_memory: LowMemory = param("auto", "on writes the senders' differences (edge scores) "
                                  "and their references (ablated passes) to files in TMPDIR "
                                  "and maps large allocations alone, for less memory and "
                                  "some more time; auto: on where a pass's differences "
                                  "reach 1 GiB")
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")
    max_batch_tokens: int = shared("max_batch_tokens")

    def __post_init__(self) -> None:
        if self.fractions:
            check_fractions(self.fractions)
        if not self.depth < 1:  # max is inclusive; the line must stay apart from the question
            raise ValueError(f"depth: expected below 1 (a fraction of the filler in [0, 1)), "
                             f"got {self.depth}")

    def grid(self) -> tuple[float, ...]:
        """The circuit sizes evaluated."""
        return self.fractions or MIB_FRACTIONS


@dataclass
class Result:
    tables_: dict[str, pd.DataFrame]
    method: str
    curve: Curve
    heads: list[str]
    level: float

    def tables(self) -> dict[str, pd.DataFrame]:
        return self.tables_

    def summary(self) -> list[str]:
        scores = self.tables_["scores"].set_index("name").value
        lines = [f"{self.method}: CPR {scores['cpr']:.3f}, CMD {scores['cmd']:.3f} "
                 f"(metric clean {scores['metric_clean']:+.3f}, empty circuit "
                 f"{scores['metric_empty']:+.3f})"]
        at = self.curve.smallest(self.level)
        if at is None:
            lines.append(f"no circuit of the grid reaches faithfulness {self.level:g}")
        else:
            lines.append(f"smallest circuit at faithfulness >= {self.level:g}: "
                         f"{self.curve.sizes[at]} edges ({self.curve.fractions[at]:g}), "
                         f"f = {self.curve.faithfulness[at]:.3f} [{self.curve.low[at]:.3f}, "
                         f"{self.curve.high[at]:.3f}]; {_heads(self.heads)}")
        rho = scores["spearman_exact"]
        lines.append(f"Spearman's rho of scores with exact edge patching (top edges): "
                     f"{rho:.3f}")
        if "class_overlap" in self.tables_:
            lines += overlap_lines(self.tables_["class_overlap"])
        return lines


def _pair(head: str) -> tuple[int, int]:
    layer, index = head[1:].split("H")
    return int(layer), int(index)


def _heads(heads: list[str], shown: int = 20) -> str:
    """The circuit's heads, the first ``shown`` of them named."""
    if not heads:
        return "no head"
    more = f" and {len(heads) - shown} more" if len(heads) > shown else ""
    return f"{len(heads)} heads: {' '.join(heads[:shown])}{more}"


def _words(value: str) -> list[str] | None:
    """A word list field: ``auto`` (the library's list), or words split on commas or spaces."""
    return None if value == "auto" else value.replace(",", " ").split()


def make_task(model: Model, cfg: Config) -> Task:
    if cfg.task == "ioi":
        return ioi_task(model, cfg.n_prompts, cfg.templates, cfg.seed,
                        names=_words(cfg.names), places=_words(cfg.places),
                        objects=_words(cfg.objects))
    if cfg.task == "greater-than":
        return greater_than_task(model, cfg.n_prompts, cfg.seed, nouns=_words(cfg.nouns))
    if cfg.task == "retrieval":
        return retrieval_task(model, cfg.n_prompts, cfg.doc_tokens, cfg.seed,
                              keys=_words(cfg.keys), values=_words(cfg.values),
                              depth=cfg.depth)
    return induction_task(model, cfg.n_prompts, cfg.seq_len, cfg.seed)


def preflight(cfg: Config, model: str | Model | None, runs_dir: Path) -> None:
    """Refuse, before the weights load, an encoder (where what is known of the model says
    so), a retrieval document beyond the model's context (where it is known), a
    greater-than run on a model whose tokenizer splits the years, and ``classes_from`` runs
    that are missing, not complete or of another model."""
    if model is None:
        return
    name = model if isinstance(model, str) else model.info.name
    facts = load_facts(model) if isinstance(model, str) else model.info
    if facts is not None:
        require(facts, causal=True, lm_head=True, what="experiment 'circuit'")
        if cfg.task == "retrieval":
            check_doc_tokens(cfg.doc_tokens, facts.n_ctx, name)
    if cfg.task == "greater-than":
        tokenizer = load_tokenizer(model) if isinstance(model, str) else model.tokenizer
        if tokenizer is not None:  # else the task refuses once the model loads
            year_tokens(tokenizer, name)
    if cfg.classes_from:
        _source_runs(cfg, model, RunStore(runs_dir))


def plan(model: Model, cfg: Config) -> Task:
    """The task's inputs, built before a run exists: a retrieval document beyond a context
    known only once the model has loaded, or too few single-token words, leave no failed
    run."""
    return make_task(model, cfg)


def _source_runs(cfg: Config, model: str | Model, store: RunStore) -> list[Run]:
    refs = parse_runs(cfg.classes_from)
    if isinstance(model, str):
        return class_runs(refs, model, None, store)
    info = model.info
    return class_runs(refs, info.name, (info.n_layers, info.n_heads), store,
                      checksum=info.checksum)


@experiment("circuit", config=Config, tables=TABLES, requires="causal_lm",
            check_model=require_graph, demo_models=("smollm2",), preflight=preflight,
            plan=plan,
            demo={"n_prompts": 8, "templates": 2, "steps": 3, "n_exact": 10, "n_boot": 200})
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Edge scores, exact patching of the top edges, and the faithfulness curve."""
    runs = None
    if cfg.classes_from:
        if ctx is None or ctx.store is None:
            raise WorkbenchError("classes_from reads stored runs: run circuit through a run "
                                 "store (workbench run, run_experiment)")
        runs = _source_runs(cfg, model, ctx.store)
    with progress.stages("circuit", 4) as stage:
        stage("graph and task")
        planned = ctx.planned if ctx is not None else None
        graph = build_graph(model)
        task = planned if isinstance(planned, Task) else make_task(model, cfg)
        stage("edge scores")
        scores = edge_scores(model, graph, task, method=cfg.method, steps=cfg.steps,
                             max_batch_tokens=cfg.max_batch_tokens, attention=cfg.attention,
                             low_memory=cfg.low_memory)
        stage("exact edge patching")
        top = scores.ranking()[: cfg.n_exact].tolist()
        exact = edge_patching(model, graph, task, top, ablation=cfg.ablation,
                              max_batch_tokens=cfg.max_batch_tokens,
                              attention=cfg.attention, low_memory=cfg.low_memory
                              ) if top else []
        stage("faithfulness")
        curve = faithfulness_curve(model, graph, task, scores, fractions=cfg.grid(),
                                   ablation=cfg.ablation, n_boot=cfg.n_boot, seed=cfg.seed,
                                   max_batch_tokens=cfg.max_batch_tokens,
                                   attention=cfg.attention, low_memory=cfg.low_memory)
    with torch.no_grad():
        per_chunk = [metric_values(model, task.corrupted[rows], task.metric, rows)
                     for rows in task.chunks(cfg.max_batch_tokens, model.paired_batches)]
    corrupted = torch.cat(per_chunk).double().cpu().numpy()
    patched = dict(zip(top, (float(x) for x in exact), strict=True))
    at = curve.smallest(cfg.level)
    digests = prompt_digests(task)
    tables = {"edges": edges_table(scores, patched), "nodes": nodes_table(model, scores),
              "faithfulness": faithfulness_table(curve),
              "scores": scores_table(curve, patched, scores, corrupted),
              "metric_by_prompt": metric_by_prompt_table(curve, corrupted, digests),
              "faithfulness_by_prompt": faithfulness_by_prompt_table(curve, digests)}
    heads = circuit_heads(tables["edges"], curve.sizes[at]) if at is not None else []
    if runs is not None:
        tables["class_overlap"] = overlap_table(
            runs, [_pair(h) for h in heads], model.info.n_layers * model.info.n_heads)
    return Result(tables, cfg.method, curve, heads, cfg.level)
