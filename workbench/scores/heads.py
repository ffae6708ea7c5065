"""Scoring heads: pattern scores with intervals and null baselines, ranking, and copying.

:func:`score_heads` runs pattern reductions (see :mod:`workbench.scores`) over prompts and
returns the long ``head_scores`` format every experiment shares, with a 95% bootstrap
interval over prompts and the score a uniform pattern would get on the same prompts
(``null``), so a reader knows what "high" means; :func:`score_heads_by_prompt` also
returns each prompt's scores. :func:`copying_scores` measures how much a
head's OV circuit raises the logit of the token it attends to (Elhage et al. 2021).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core import progress
from workbench.inputs.prompts import Prompt, tokens_digest
from workbench.models import adapters
from workbench.models.base import Model
from workbench.recording.reductions import Reduction, layer_nulls, reduce_patterns
from workbench.scores import classes
from workbench.scores.stats import bootstrap_mean_ci, summarize
from workbench.store.schema import head_classes, head_scores_by_prompt


def score_heads(model: Model, prompts: Sequence[Prompt], reductions: Mapping[str, Reduction],
                *, inputs: str, n_boot: int = 1000, seed: int = 0,
                max_batch_tokens: int = 2048) -> pd.DataFrame:
    """Per-head scores with bootstrap intervals and the uniform-pattern null.

    Returns:
        ``layer, head, metric, score, ci_low, ci_high, n_prompts, null, inputs``.
    """
    return score_heads_by_prompt(model, prompts, reductions, inputs=inputs, n_boot=n_boot,
                                 seed=seed, max_batch_tokens=max_batch_tokens).head_scores


class Scored(NamedTuple):
    """What :func:`score_heads_by_prompt` returns."""

    head_scores: pd.DataFrame
    """As :func:`score_heads` returns it: each score the mean of ``by_prompt``'s."""
    by_prompt: pd.DataFrame
    """The ``head_scores_by_prompt`` rows (:func:`scores_by_prompt`)."""


def score_heads_by_prompt(model: Model, prompts: Sequence[Prompt],
                          reductions: Mapping[str, Reduction], *, inputs: str,
                          n_boot: int = 1000, seed: int = 0, max_batch_tokens: int = 2048
                          ) -> Scored:
    """:func:`score_heads` and each prompt's scores it averages, from one scan, so that
    two runs can be paired prompt by prompt (:mod:`workbench.harness.compare`).

    Returns:
        The head scores and their per-prompt rows (:class:`Scored`).
    """
    per_prompt = reduce_patterns(model, prompts, reductions, max_batch_tokens=max_batch_tokens,
                                 desc=f"scoring {inputs}")
    table = summarize(per_prompt, n_boot=n_boot, seed=seed)
    table = _with_null(table, layer_nulls(model, prompts, reductions))
    table["inputs"] = inputs
    return Scored(table, scores_by_prompt(per_prompt, prompts, inputs))


def _with_null(table: pd.DataFrame, uniform: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each row's null: its layer's uniform score of its metric
    (:func:`~workbench.recording.reductions.layer_nulls`), the mean over the prompts."""
    null = uniform.groupby(["layer", "metric"]).score.mean().rename("null").reset_index()
    merged = table.merge(null, on=["layer", "metric"], how="left", validate="many_to_one")
    return merged.astype({"null": "float64"})


class Classified(NamedTuple):
    """What :func:`score_and_classify` returns."""

    head_scores: pd.DataFrame
    """As :func:`score_heads` returns it."""
    head_classes: pd.DataFrame
    """One row per (head, class); empty when no metric has a class."""
    per_prompt: pd.DataFrame
    """The real prompts' scores of the metrics: ``prompt, layer, head, metric, score``."""
    untested: dict[str, str]
    """The classes whose null could not be made, each with the reason (their metrics are
    still scored)."""


def score_and_classify(model: Model, prompts: Sequence[Prompt],
                       reductions: Mapping[str, Reduction], *, inputs: str,
                       testing: classes.Testing, repeats: tuple[int, int] | None = None,
                       n_boot: int = 1000, seed: int = 0, max_batch_tokens: int = 2048
                       ) -> Classified:
    """:func:`score_heads`, and every head tested for the classes of those metrics
    (:mod:`workbench.scores.classes`), from one scan: each class's null twins of the
    prompts are batched with the real prompts, and a pattern null is read in the same pass.

    Args:
        repeats: ``(seq_len, repeats)`` of ``repeated-random`` prompts, which the ``input``
            nulls (induction, duplicate-token) are made from.
        testing: the false-discovery rate, the sign-flip draws and their seed.

    Returns:
        The head scores, the classes and the real prompts' scores (:class:`Classified`).
    """
    untested = _untested(model, prompts, classes.for_metrics(reductions), repeats)
    tested = [c for c in classes.for_metrics(reductions) if c.name not in untested]
    scan = dict(reductions)
    everything, reference, twins = list(prompts), list(prompts), {}
    gen = torch.Generator().manual_seed(testing.seed)
    for head_class in tested:
        if head_class.kind == "input":
            assert repeats is not None  # _untested raised without them
            twins[head_class.name] = len(everything)
            build = classes.NULL_INPUTS[head_class.name]
            everything += [build(model, p, *repeats, gen) for p in prompts]
            reference += prompts
        elif head_class.kind == "pattern":
            scan |= {k: classes.PATTERN_REDUCTIONS[k]
                     for k in classes.PATTERN_NULLS[head_class.name]}
    per_prompt = reduce_patterns(model, everything, scan, max_batch_tokens=max_batch_tokens,
                                 desc=f"scoring {inputs}",
                                 reference=reference if twins else None)
    n = len(prompts)
    real = per_prompt[per_prompt.prompt < n]
    table = summarize(real[real.metric.isin(list(reductions))], n_boot=n_boot, seed=seed)
    uniform = layer_nulls(model, prompts, {**reductions, **{
        k: v for k, v in scan.items() if k in classes.PATTERN_REDUCTIONS}})
    table = _with_null(table, uniform[uniform.metric.isin(list(reductions))])
    table["inputs"] = inputs
    rows = []
    for head_class in tested:
        observed, against = _tested_against(head_class, per_prompt, n, twins, testing.eps)
        chance = uniform[uniform.metric == observed.metric.iloc[0]].drop(columns="metric") \
            if len(observed) else None
        rows.append(classes.classify(head_class, observed, against, testing=testing,
                                     n_boot=n_boot, seed=seed, inputs=inputs, chance=chance))
    found = pd.concat(rows, ignore_index=True) if rows else head_classes().empty()
    kept = real[real.metric.isin(list(reductions))].reset_index(drop=True)
    return Classified(table, found, kept, untested)


def scores_by_prompt(per_prompt: pd.DataFrame, prompts: Sequence[Prompt], inputs: str
                     ) -> pd.DataFrame:
    """The ``head_scores_by_prompt`` rows (:func:`workbench.store.schema.head_scores_by_prompt`)
    of :attr:`Classified.per_prompt`: each prompt's token digest and the inputs' name added.

    Args:
        per_prompt: ``prompt, layer, head, metric, score`` of ``prompts``, numbered from 0.
        prompts: the prompts scored.
        inputs: what they are (the ``inputs`` of ``head_scores``).
    """
    digests = np.array([tokens_digest(p) for p in prompts])
    out = per_prompt.reset_index(drop=True)
    out = out.assign(tokens=digests[out.prompt.to_numpy(dtype=int)], inputs=inputs)
    return out[head_scores_by_prompt().names].astype({"prompt": "int64", "layer": "int64",
                                                      "head": "int64", "score": "float64"})


def _tested_against(head_class: classes.HeadClass, per_prompt: pd.DataFrame, n: int,
                    twins: Mapping[str, int], eps: float
                    ) -> tuple[pd.DataFrame, pd.DataFrame | float]:
    """What one class tests, per prompt, and its null: the real prompts' metric against
    ``eps``; an ``input`` class against the same metric on the class's null twins (the
    ``n`` prompts from ``twins[class]``, numbered as the real ones); a ``pattern`` class's
    tested metric against its null metric, both on the real prompts."""
    real = per_prompt[per_prompt.prompt < n]
    observed = real[real.metric == head_class.metric]
    against: pd.DataFrame | float = eps
    if head_class.kind == "input":
        start = twins[head_class.name]
        twin = per_prompt[(per_prompt.prompt >= start) & (per_prompt.prompt < start + n)]
        against = twin[twin.metric == head_class.metric].assign(
            prompt=lambda f, start=start: f.prompt - start)
    elif head_class.kind == "pattern":
        tested_name, null_name = classes.PATTERN_NULLS[head_class.name]
        observed = real[real.metric == tested_name]
        against = real[real.metric == null_name]
    return observed, against


def _untested(model: Model, prompts: Sequence[Prompt], tested: Sequence[classes.HeadClass],
              repeats: tuple[int, int] | None) -> dict[str, str]:
    """The classes among ``tested`` whose null inputs cannot be made, with the reason.

    Raises:
        ValueError: an ``input`` class without the ``repeats`` its null is made from.
    """
    untested = {}
    for head_class in tested:
        if head_class.kind != "input":
            continue
        if repeats is None:
            raise ValueError(f"the {head_class.name} null is made from repeated-random "
                             "prompts: give their (seq_len, repeats)")
        check = classes.NULL_PROBLEMS.get(head_class.name)
        problems = (check(model, p, *repeats) for p in prompts) if check else ()
        problem = next((p for p in problems if p is not None), None)
        if problem is not None:
            untested[head_class.name] = problem
    return untested


def top_heads(head_scores: pd.DataFrame, metric: str, k: int,
              exclude: Iterable[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """The ``k`` highest-scoring (layer, head) pairs for ``metric``, best first."""
    skip = set(exclude)
    ranked = head_scores[head_scores.metric == metric].sort_values("score", ascending=False)
    heads = [(int(layer), int(head))
             for layer, head in zip(ranked.layer, ranked["head"], strict=True)]
    return [h for h in heads if h not in skip][:k]


def _kv_index(model: Model, head: int) -> int:
    """The key-value head a query head reads (grouped-query attention repeats each kv head
    for ``n_heads / n_kv_heads`` consecutive query heads)."""
    return head // (model.info.n_heads // model.info.n_kv_heads)


def _value_bias(bridge, info) -> Float[Tensor, "layer kv d_head"]:
    try:
        return bridge.b_V
    except AttributeError:  # bias-free projections (Llama)
        return torch.zeros(info.n_layers, info.n_kv_heads, info.d_head)


def _first_norm(model: Model, layer: int) -> Callable[[Tensor], Tensor]:
    """What the attention of ``layer`` applies to the residual stream it reads: the
    block's first norm, or nothing in a post-norm block (OLMo 2 norms sublayer outputs)."""
    if adapters.FAMILIES_BY_ARCHITECTURE.get(model.info.architecture, None) is not None \
            and adapters.adapter_of(model).norm == "post":
        return lambda x: x
    return model.bridge.blocks[layer].ln1


def copying_scores(model: Model, tokens: Int[Tensor, " n"], *, chunk: int = 64
                   ) -> Float[Tensor, "n layer head_index"]:
    """Standardised direct-path logit of the attended token, per token and head.

    For a token ``t`` attended to by head ``h`` of layer ``l``, its value vector is
    ``v = ln1_l(W_E[t]) W_V^h + b_V^h`` and the head writes ``o = v W_O^h`` to the
    residual stream. On the direct path to the logits, ``o`` goes through the final norm
    (its bias, which does not depend on the head, is removed) and the unembedding. The
    score is the z-score of ``t``'s own logit among all logits,
    ``(logit[t] - mean(logit)) / std(logit)``: 0 for a head whose output is unrelated to
    the token it reads, large and positive for a copying head. The z-score makes heads
    comparable and is unaffected by the positive per-token scale of RMS/LayerNorm, so the
    norms' data-dependent scale does not need the rest of the residual stream. Averaged
    over a token drawn uniformly from the vocabulary the z-score is exactly 0, which is
    the null baseline.

    The logits are never formed: for a normed output ``y``, their mean over the vocabulary
    is ``y . mean_v(W_U[:, v])`` and their variance the quadratic form ``y C y`` of the
    unembedding's column covariance ``C`` (``d_model x d_model``, once per call), so a
    head costs ``d_model^2`` per token instead of ``d_model x d_vocab`` (on a
    262,144-token vocabulary, 58 s -> 2 s for 200 tokens on every head of Gemma 3 270M).
    ``std`` is the sample standard deviation (``d_vocab - 1``), as ``Tensor.std``.

    Args:
        tokens: token ids to test (e.g. random ids from the middle of the vocabulary).

    Returns:
        ``[n, layer, head]`` z-scores.
    """
    model.require(causal=True, lm_head=True, what="the copying score")
    bridge, info = model.bridge, model.info
    out = torch.empty(len(tokens), info.n_layers, info.n_heads)
    with torch.inference_mode():
        w_e = bridge.W_E
        mean, covariance = _unembedding_moments(bridge.W_U)
        own_columns = bridge.W_U.T[tokens].double()  # [n, d_model]
        w_v_all, w_o_all, b_v_all = bridge.W_V, bridge.W_O, _value_bias(bridge, info)
        final_bias = bridge.ln_final(torch.zeros(1, info.d_model))
        kv = torch.tensor([_kv_index(model, h) for h in range(info.n_heads)])
        for layer in progress.track(range(info.n_layers), desc="copying"):
            # stacked weights are per key-value head; index them by query head
            w_v = w_v_all[layer][kv] if w_v_all.shape[1] != info.n_heads else w_v_all[layer]
            b_v = b_v_all[layer][kv] if b_v_all.shape[1] != info.n_heads else b_v_all[layer]
            w_o = w_o_all[layer]  # [head, d_head, d_model]
            for start in range(0, len(tokens), chunk):
                t = tokens[start:start + chunk]
                x = _first_norm(model, layer)(w_e[t])  # [n, d_model]
                v = einops.einsum(x, w_v, "n d_model, head d_model d_head -> n head d_head")
                o = einops.einsum(v + b_v, w_o,
                                  "n head d_head, head d_head d_model -> n head d_model")
                y = (bridge.ln_final(o) - final_bias).double()  # [n, head, d_model]
                own = einops.einsum(y, own_columns[start:start + chunk],
                                    "n head d_model, n d_model -> n head")
                spread = einops.einsum(y @ covariance, y, "n head d, n head d -> n head")
                z = (own - y @ mean) / spread.sqrt()
                out[start:start + chunk, layer] = z.float()
    return out


def _unembedding_moments(w_u: Float[Tensor, "d_model d_vocab"], *, block: int = 16384
                         ) -> tuple[Float[Tensor, " d_model"], Float[Tensor, "d_model d_model"]]:
    """The mean of the unembedding's columns and their sample covariance (``d_vocab - 1``),
    in float64: each block of columns in float32 (or ``w_u``'s wider dtype), the blocks
    summed in float64."""
    d_model, d_vocab = w_u.shape
    work = torch.promote_types(w_u.dtype, torch.float32)
    blocks = [slice(s, s + block) for s in range(0, d_vocab, block)]
    total = torch.zeros(d_model, dtype=torch.float64)
    for b in blocks:
        total += w_u[:, b].double().sum(1)
    mean = total / d_vocab
    centre = mean.to(work)
    covariance = torch.zeros(d_model, d_model, dtype=torch.float64)
    for b in blocks:
        columns = w_u[:, b].to(work) - centre[:, None]  # [d_model, block]
        covariance += (columns @ columns.T).double()
    # centred on the rounded mean: take off the rank-one part of the rounding
    shift = mean - centre.double()
    covariance -= d_vocab * torch.outer(shift, shift)
    return mean, covariance / (d_vocab - 1)


def summarize_tokens(values: Float[Tensor, "n layer head_index"], metric: str, *,
                     null: float, inputs: str, n_boot: int = 1000, seed: int = 0
                     ) -> pd.DataFrame:
    """Long-format head scores from per-token values, with a bootstrap over tokens."""
    array = values.numpy().astype(np.float64)
    low, high = bootstrap_mean_ci(array, n_boot=n_boot, seed=seed)
    mean = array.mean(0)
    n_layers, n_heads = mean.shape
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    return pd.DataFrame({
        "layer": layer.ravel(), "head": head.ravel(), "metric": metric, "score": mean.ravel(),
        "ci_low": low.ravel(), "ci_high": high.ravel(), "n_prompts": array.shape[0],
        "null": null, "inputs": inputs,
    })


def tokens_by_prompt(values: Float[Tensor, "n layer head_index"], metric: str,
                     tokens: Int[Tensor, " n"], *, inputs: str) -> pd.DataFrame:
    """The ``head_scores_by_prompt`` rows of per-token values (what
    :func:`summarize_tokens` averages): each token its own prompt, numbered from 0 in the
    order of ``tokens``, with the digest of that one token id."""
    n, n_layers, n_heads = values.shape
    prompt, layer, head = np.meshgrid(np.arange(n), np.arange(n_layers), np.arange(n_heads),
                                      indexing="ij")
    per_prompt = pd.DataFrame({"prompt": prompt.ravel(), "layer": layer.ravel(),
                               "head": head.ravel(), "metric": metric,
                               "score": values.numpy().astype(np.float64).ravel()})
    prompts = [Prompt(token_ids=(int(t),)) for t in tokens.tolist()]
    return scores_by_prompt(per_prompt, prompts, inputs)
