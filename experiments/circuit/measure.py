"""The circuit experiment's tasks and tables."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from workbench.inputs.greater_than import greater_than_prompts, year_tokens
from workbench.inputs.ioi import ioi_prompts
from workbench.inputs.prompts import Prompt, random_token_ids, tokens_digest
from workbench.inputs.retrieval import retrieval_prompts
from workbench.interventions.circuits.attribution import EdgeScores
from workbench.interventions.circuits.faithfulness import Curve
from workbench.interventions.circuits.task import (
    LogitDifference,
    ProbabilityDifference,
    TargetLogProb,
    Task,
    check_lengths,
)
from workbench.models.base import Model
from workbench.scores.stats import spearman

_HEAD = r"L\d+H\d+"
"""A head's node name (``L9H4``), as a sender."""


def _padded(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    # right padding is never read: every metric position comes before it, and a causal
    # model's earlier positions do not see later ones
    width = max(len(r) for r in rows)
    return torch.tensor([[*r, *([pad] * (width - len(r)))] for r in rows])


def ioi_task(model: Model, n_prompts: int, templates: int, seed: int, *,
             names: Sequence[str] | None = None, places: Sequence[str] | None = None,
             objects: Sequence[str] | None = None) -> Task:
    """Wang et al.'s IOI prompts (the first ``templates``), their ABC corruption, and the
    logit difference IO - S at END."""
    prompts = ioi_prompts(model, n_prompts, templates=range(templates), seed=seed,
                          names=names, places=places, objects=objects)
    check_lengths([len(p.ids) for p in prompts], [len(p.corrupted) for p in prompts])
    clean = _padded([p.ids for p in prompts], model.pad_id)
    corrupted = _padded([p.corrupted for p in prompts], model.pad_id)
    metric = LogitDifference(torch.tensor([p.io_id for p in prompts]),
                             torch.tensor([p.s_id for p in prompts]),
                             torch.tensor([p.roles["END"] for p in prompts]))
    return Task(clean, corrupted, metric)


def induction_task(model: Model, n_prompts: int, seq_len: int, seed: int) -> Task:
    """``[BOS] A A`` against ``[BOS] A B`` (B fresh random tokens), and the mean
    log-probability of A's tokens over the second repeat (the negative loss there; each
    repeat's first token left out)."""
    gen = torch.Generator().manual_seed(seed)
    clean, corrupted = [], []
    for _ in range(n_prompts):
        first = random_token_ids(model, seq_len, gen)
        other = random_token_ids(model, seq_len, gen)
        clean.append(model.frame(first * 2))
        corrupted.append(model.frame(first + other))
    ids = torch.tensor(clean)
    start = ids.shape[1] - seq_len  # the second repeat's first position
    mask = torch.zeros(ids.shape)
    mask[:, start: -1] = 1  # predicting positions start+1 .. end
    targets = torch.roll(ids, -1, 1)
    return Task(ids, torch.tensor(corrupted), TargetLogProb(targets, mask))


def greater_than_task(model: Model, n_prompts: int, seed: int, *,
                      nouns: Sequence[str] | None = None) -> Task:
    """Hanna et al.'s greater-than prompts against their start year 01, and the probability
    of the years after the start year minus those up to it, at the last position."""
    prompts = greater_than_prompts(model, n_prompts, seed=seed, nouns=nouns)
    check_lengths([len(p.ids) for p in prompts], [len(p.corrupted) for p in prompts])
    metric = ProbabilityDifference(torch.tensor(year_tokens(model.tokenizer, model.info.name)),
                                   torch.tensor([p.start for p in prompts]),
                                   torch.tensor([p.position for p in prompts]))
    return Task(_padded([p.ids for p in prompts], model.pad_id),
                _padded([p.corrupted for p in prompts], model.pad_id), metric)


def retrieval_task(model: Model, n_prompts: int, doc_tokens: int, seed: int, *,
                   keys: Sequence[str] | None = None, values: Sequence[str] | None = None,
                   depth: float = 0.0) -> Task:
    """Documents of ``doc_tokens`` tokens with a key and its value planted at the start (or
    ``depth`` into the filler) and the key asked for at the end, against the same documents
    planting another value; the logit difference of the planted value over the other one
    at the last position."""
    prompts = retrieval_prompts(model, n_prompts, doc_tokens=doc_tokens, seed=seed, keys=keys,
                                values=values, depth=depth)
    check_lengths([len(p.ids) for p in prompts], [len(p.corrupted) for p in prompts])
    metric = LogitDifference(torch.tensor([p.value_id for p in prompts]),
                             torch.tensor([p.corrupted_id for p in prompts]),
                             torch.tensor([p.position for p in prompts]))
    return Task(torch.tensor([p.ids for p in prompts]),
                torch.tensor([p.corrupted for p in prompts]), metric)


def edges_table(scores: EdgeScores, exact: dict[int, float]) -> pd.DataFrame:
    """One row per edge, with its rank by ``|score|`` and its exact effect where patched."""
    graph = scores.graph
    s, r = graph.edge_index()
    values = scores.per_edge().numpy()
    rank = np.empty(len(values), dtype=np.int64)
    rank[scores.ranking().numpy()] = np.arange(1, len(values) + 1)
    return pd.DataFrame({
        "sender": [graph.senders[int(i)].name for i in s],
        "receiver": [graph.receivers[int(i)].name for i in r],
        "sender_layer": [graph.senders[int(i)].layer for i in s],
        "receiver_layer": [graph.receivers[int(i)].layer for i in r],
        "receiver_input": [graph.receivers[int(i)].kind for i in r],
        "score": values,
        "rank": rank,
        "exact": [exact.get(k, np.nan) for k in range(len(values))],
    })


def nodes_table(model: Model, scores: EdgeScores) -> pd.DataFrame:
    """Every node's summed scores, out of it and into its inputs."""
    graph, values = scores.graph, scores.values
    per_group = model.info.n_heads // model.info.n_kv_heads
    incoming = values.sum(0)
    rows = []
    for i, sender in enumerate(graph.senders):
        into = [k for k, r in enumerate(graph.receivers) if r.layer == sender.layer
                and _feeds(r.kind, r.head, sender.kind, sender.head, per_group)]
        rows.append((sender.name, sender.kind, sender.layer,
                     -1 if sender.head is None else sender.head, sender.layer_type or "-",
                     float(values[i].sum()), float(incoming[into].sum()),
                     float(values[i].abs().sum())))
    rows.append(("logits", "logits", model.info.n_layers, -1, "-", 0.0,
                 float(incoming[-1]), 0.0))
    return pd.DataFrame(rows, columns=["node", "kind", "layer", "head", "layer_type",
                                       "score_out", "score_in", "abs_out"])


def _feeds(receiver: str, index: int | None, kind: str, head: int | None,
           per_group: int) -> bool:
    """Whether a receiver input of the node's layer is one of the node's own inputs."""
    if kind == "mlp":
        return receiver == "mlp"
    if kind != "head" or head is None:
        return False
    return (receiver == "q" and index == head) or (
        receiver in ("k", "v") and index == head // per_group)


def faithfulness_table(curve: Curve) -> pd.DataFrame:
    return pd.DataFrame({"fraction": curve.fractions, "n_edges": curve.sizes,
                         "faithfulness": curve.faithfulness, "ci_low": curve.low,
                         "ci_high": curve.high})


def prompt_digests(task: Task) -> list[str]:
    """Each prompt's ``tokens`` digest (:func:`workbench.inputs.prompts.tokens_digest`) of
    its clean ids followed by its corrupted ids: a circuit's prompt is the pair."""
    return [tokens_digest(Prompt(token_ids=(*clean, *corrupted))) for clean, corrupted
            in zip(task.clean.tolist(), task.corrupted.tolist(), strict=True)]


def metric_by_prompt_table(curve: Curve, corrupted: Float[np.ndarray, " prompt"],
                           digests: Sequence[str]) -> pd.DataFrame:
    """Each prompt's metric with every edge kept, with none, and on the corrupted input:
    the values ``scores``' ``metric_clean``, ``metric_empty`` and ``metric_corrupted``
    average."""
    return pd.DataFrame({"prompt": np.arange(len(digests)), "tokens": list(digests),
                         "clean": curve.full, "empty": curve.empty, "corrupted": corrupted})


def faithfulness_by_prompt_table(curve: Curve, digests: Sequence[str]) -> pd.DataFrame:
    """Each prompt's metric with each circuit of the curve kept: the ``m(C)`` whose means
    over prompts the curve's faithfulness is made of."""
    n, sizes = len(digests), len(curve.fractions)
    return pd.DataFrame({"prompt": np.repeat(np.arange(n), sizes),
                         "tokens": np.repeat(list(digests), sizes),
                         "fraction": np.tile(curve.fractions, n),
                         "n_edges": np.tile(curve.sizes, n),
                         "metric": curve.circuits.reshape(-1)})


def scores_table(curve: Curve, exact: dict[int, float], scores: EdgeScores,
                 corrupted: Float[np.ndarray, " prompt"]) -> pd.DataFrame:
    per_edge = scores.per_edge().numpy()
    keys = sorted(exact)
    rho = spearman(np.array([per_edge[k] for k in keys]), np.array([exact[k] for k in keys]))
    return pd.DataFrame({"name": ["cpr", "cmd", "spearman_exact", "metric_clean",
                                  "metric_empty", "metric_corrupted"],
                         "value": [curve.cpr(), curve.cmd(), rho, float(curve.full.mean()),
                                   float(curve.empty.mean()), float(corrupted.mean())]})


def circuit_heads(edges: pd.DataFrame, n_edges: int) -> list[str]:
    """The heads with an edge (their output, or their q input) among the top ``n_edges`` of
    an ``edges`` table by rank, in (layer, head) order: the circuit's heads at that size."""
    top = edges[edges["rank"] <= n_edges]
    heads = set(top.sender[top.sender.str.fullmatch(_HEAD)])
    heads |= {r.split(".")[0] for r in top.receiver[top.receiver_input == "q"]}
    return sorted(heads, key=lambda h: tuple(int(x) for x in h[1:].split("H")))
