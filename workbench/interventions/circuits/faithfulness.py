"""Circuits cut from edge scores, their faithfulness curve, and MIB's CPR and CMD.

A circuit of size ``p`` is the ``ceil(p * E)`` edges of largest ``|score|`` (of ``E``
edges; ties broken by edge order). Its faithfulness (Mueller et al. 2025, MIB)::

    f(C) = (m(C) - m(empty)) / (m(full) - m(empty))

with ``m`` the metric averaged over prompts, every edge outside ``C`` ablated
(:mod:`workbench.interventions.circuits.ablate`); ``m(full)`` and ``m(empty)`` are run
through the same machinery (every edge kept, none kept), so the full circuit's
faithfulness is exactly 1 and the empty one's exactly 0. Its 95% interval is a bootstrap
over prompts of that ratio of means.

CPR and CMD follow MIB's evaluation code: the trapezoid areas over the size grid (the
fraction of edges on the x-axis, from the grid's first size to its last) under the curve
(CPR, higher is better) and between the curve and 1, ``|1 - f|`` (CMD, 0 is best).

Examples:
    >>> curve = faithfulness_curve(model, graph, task, scores)   # doctest: +SKIP
    >>> curve.cpr(), curve.cmd()                                 # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from workbench.core.options import AttentionPath
from workbench.interventions.circuits.ablate import Ablation, check_ablation, circuit_metrics
from workbench.interventions.circuits.attribution import EdgeScores, LowMemory
from workbench.interventions.circuits.graph import Graph
from workbench.interventions.circuits.task import Task, check_fractions
from workbench.models.base import Model
from workbench.scores.stats import bootstrap_ratio_ci

MIB_FRACTIONS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""MIB's circuit sizes, as fractions of the edges."""


def circuit_size(fraction: float, n_edges: int) -> int:
    """How many edges a circuit of ``fraction`` of ``n_edges`` holds (at least one)."""
    return max(1, min(n_edges, math.ceil(fraction * n_edges - 1e-9)))


def top_edges(scores: EdgeScores, n: int) -> Bool[Tensor, "sender receiver"]:
    """The ``n`` edges of largest ``|score|`` as a ``[sender, receiver]`` mask."""
    s, r = scores.graph.edge_index()
    chosen = scores.ranking()[:n]
    keep = torch.zeros_like(scores.graph.edges)
    keep[s[chosen], r[chosen]] = True
    return keep


@dataclass(frozen=True)
class Curve:
    """Faithfulness over circuit sizes, with the per-prompt metrics it came from."""

    fractions: tuple[float, ...]
    sizes: tuple[int, ...]
    """edges in each circuit"""
    faithfulness: Float[np.ndarray, " size"]
    low: Float[np.ndarray, " size"]
    high: Float[np.ndarray, " size"]
    circuits: Float[np.ndarray, "prompt size"]
    full: Float[np.ndarray, " prompt"]
    empty: Float[np.ndarray, " prompt"]

    def cpr(self) -> float:
        """MIB's CPR: the area under the curve."""
        return area(self.fractions, self.faithfulness)

    def cmd(self) -> float:
        """MIB's CMD: the area between the curve and 1."""
        return area(self.fractions, np.abs(1.0 - self.faithfulness))

    def smallest(self, level: float) -> int | None:
        """The index of the smallest circuit whose faithfulness reaches ``level``."""
        hits = np.nonzero(self.faithfulness >= level)[0]
        return int(hits[0]) if hits.size else None


def area(x: Sequence[float], y: Float[np.ndarray, " size"]) -> float:
    """The trapezoid area under ``y`` over ``x`` (MIB's rule)."""
    return float(sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1)))


def faithfulness(values: Float[np.ndarray, "prompt size"], full: Float[np.ndarray, " prompt"],
                 empty: Float[np.ndarray, " prompt"]) -> Float[np.ndarray, " size"]:
    """``(mean m(C) - mean m(empty)) / (mean m(full) - mean m(empty))`` per circuit."""
    return (values.mean(0) - empty.mean()) / (full.mean() - empty.mean())


def faithfulness_curve(model: Model, graph: Graph, task: Task, scores: EdgeScores, *,
                       fractions: Sequence[float] = MIB_FRACTIONS,
                       ablation: Ablation = "corrupted", n_boot: int = 1000, seed: int = 0,
                       max_batch_tokens: int = 512, attention: AttentionPath = "auto",
                       low_memory: LowMemory = "auto") -> Curve:
    """Evaluate the top-``|score|`` circuit at each size.

    Args:
        model, graph, task: as for the scores.
        scores: edge scores of ``graph``.
        fractions: circuit sizes in ``(0, 1]``, ascending.
        ablation: what an edge outside a circuit carries (``corrupted`` or ``mean``).
        n_boot, seed: the bootstrap over prompts.
        max_batch_tokens: tokens per pass.
        attention: ``blocked``, ``dense`` or ``auto``.
        low_memory: as for :func:`~workbench.interventions.circuits.ablate.circuit_metrics`.

    Raises:
        WorkbenchError: a size outside ``(0, 1]`` or an unknown ablation.
    """
    check_fractions(fractions)
    check_ablation(ablation)
    fractions = tuple(sorted(float(f) for f in fractions))
    sizes = tuple(circuit_size(f, graph.n_edges) for f in fractions)
    keeps = [graph.edges.clone(), torch.zeros_like(graph.edges)]
    keeps += [top_edges(scores, n) for n in sizes]
    got = circuit_metrics(model, graph, task, keeps, ablation=ablation,
                          max_batch_tokens=max_batch_tokens, attention=attention,
                          low_memory=low_memory, desc="faithfulness")
    full, empty, values = got[:, 0], got[:, 1], got[:, 2:]
    low, high = bootstrap_ratio_ci(values - empty[:, None], full - empty, n_boot=n_boot,
                                   seed=seed)
    return Curve(fractions, sizes, faithfulness(values, full, empty), low, high, values,
                 full, empty)
