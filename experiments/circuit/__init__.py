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
  loss there).

Tables: ``edges`` (every edge's score, rank and, for the top ``n_exact``, its exact
effect), ``nodes`` (each node's summed scores), ``faithfulness`` (the curve with its
intervals) and ``scores`` (CPR, CMD, the rank correlation, the clean, empty and corrupted
metrics: the empty circuit's metric is the corrupted run's under corrupted ablation).

Example:
    workbench run circuit --model smollm2 --set task=ioi --set n_prompts=16
    python -m experiments.circuit --model smollm2 --set task=induction --set method=eap
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pandas as pd
import torch

from experiments.circuit.measure import (
    circuit_heads,
    edges_table,
    faithfulness_table,
    induction_task,
    ioi_task,
    nodes_table,
    scores_table,
)
from experiments.circuit.tables import TABLES
from workbench.core import progress
from workbench.core.options import AttentionPath
from workbench.core.values import MAX_PROMPTS
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.inputs.ioi import TEMPLATES
from workbench.interventions.circuits.ablate import Ablation, edge_patching
from workbench.interventions.circuits.attribution import Method, edge_scores
from workbench.interventions.circuits.faithfulness import (
    MIB_FRACTIONS,
    Curve,
    faithfulness_curve,
)
from workbench.interventions.circuits.graph import build_graph, require_graph
from workbench.interventions.circuits.task import Task, check_fractions
from workbench.models.base import Model

TaskName = Literal["ioi", "induction"]


@dataclass(frozen=True)
class Config:
    task: TaskName = param("ioi", "the task: ioi (logit difference IO - S) or induction "
                           "(log-probability over the second repeat of random tokens)")
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
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")
    max_batch_tokens: int = shared("max_batch_tokens")

    def __post_init__(self) -> None:
        if self.fractions:
            check_fractions(self.fractions)

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
        return lines


def _heads(heads: list[str], shown: int = 20) -> str:
    """The circuit's heads, the first ``shown`` of them named."""
    if not heads:
        return "no head"
    more = f" and {len(heads) - shown} more" if len(heads) > shown else ""
    return f"{len(heads)} heads: {' '.join(heads[:shown])}{more}"


def make_task(model: Model, cfg: Config) -> Task:
    if cfg.task == "ioi":
        words = {k: None if v == "auto" else v.replace(",", " ").split() for k, v in
                 (("names", cfg.names), ("places", cfg.places), ("objects", cfg.objects))}
        return ioi_task(model, cfg.n_prompts, cfg.templates, cfg.seed, **words)
    return induction_task(model, cfg.n_prompts, cfg.seq_len, cfg.seed)


@experiment("circuit", config=Config, tables=TABLES, requires="causal_lm",
            check_model=require_graph, demo_models=("smollm2",),
            demo={"n_prompts": 8, "templates": 2, "steps": 3, "n_exact": 10, "n_boot": 200})
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Edge scores, exact patching of the top edges, and the faithfulness curve."""
    with progress.stages("circuit", 4) as stage:
        stage("graph and task")
        graph, task = build_graph(model), make_task(model, cfg)
        stage("edge scores")
        scores = edge_scores(model, graph, task, method=cfg.method, steps=cfg.steps,
                             max_batch_tokens=cfg.max_batch_tokens, attention=cfg.attention)
        stage("exact edge patching")
        top = scores.ranking()[: cfg.n_exact].tolist()
        exact = edge_patching(model, graph, task, top, ablation=cfg.ablation,
                              max_batch_tokens=cfg.max_batch_tokens,
                              attention=cfg.attention) if top else []
        stage("faithfulness")
        curve = faithfulness_curve(model, graph, task, scores, fractions=cfg.grid(),
                                   ablation=cfg.ablation, n_boot=cfg.n_boot, seed=cfg.seed,
                                   max_batch_tokens=cfg.max_batch_tokens,
                                   attention=cfg.attention)
    with torch.no_grad():
        corrupted = float(torch.cat([task.metric(model.bridge(task.corrupted[rows]), rows)
                                     for rows in task.chunks(cfg.max_batch_tokens)]).mean())
    patched = dict(zip(top, (float(x) for x in exact), strict=True))
    at = curve.smallest(cfg.level)
    heads = circuit_heads(graph, scores, curve.sizes[at]) if at is not None else []
    tables = {"edges": edges_table(scores, patched), "nodes": nodes_table(model, scores),
              "faithfulness": faithfulness_table(curve),
              "scores": scores_table(curve, patched, scores, corrupted)}
    return Result(tables, cfg.method, curve, heads, cfg.level)
