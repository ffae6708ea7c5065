"""The summaries of attention-sinks over prompts (sink rates with their uniform null, the
top receivers, mean scores with intervals, the sink class, massive activations beside the
sink heads) and the :class:`Result` with its summary lines (definitions in the package
docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from experiments.attention_sinks.scans import CATEGORICAL, KINDS, TOP_RANKS
from workbench.inputs.prompts import Prompt
from workbench.inputs.token_types import PADDED, TOKEN_TYPES
from workbench.models.base import Model
from workbench.recording import reductions
from workbench.recording.residuals import (
    MASSIVE_MAGNITUDE,
    MASSIVE_RATIO,
    is_massive,
    massive_by_boundary,
)
from workbench.scores import classes, metrics
from workbench.scores.stats import bootstrap_mean_ci, summarize

if TYPE_CHECKING:
    from experiments.attention_sinks import Config

LayerGroup = Literal["all", "sliding", "global"]


def uniform_alpha(n: int, causal: bool, window: int | None) -> float:
    """alpha_1 of attention uniform over the keys each query sees, on ``n`` real tokens:
    ``(1/n) sum_t [0 visible from t] / (keys visible from t)``. Causal: query ``t`` sees
    ``min(t + 1, window)`` keys, and position 0 only while ``t < window``; an encoder's
    every query sees all ``n`` (so 1/n)."""
    if not causal:
        return 1.0 / n
    reach = n if window is None else min(n, window)  # queries that still see position 0
    return float(sum(1.0 / (t + 1) for t in range(reach)) / n)


def _layer_groups(alpha: pd.DataFrame) -> list[tuple[LayerGroup, pd.DataFrame]]:
    """Every layer (``all``), and each layer type alone when the model has both."""
    groups: list[tuple[LayerGroup, pd.DataFrame]] = [("all", alpha)]
    if "layer_type" in alpha.columns and alpha.layer_type.nunique() > 1:
        groups += [(kind, alpha[alpha.layer_type == kind]) for kind in ("sliding", "global")]
    return groups


def _null_rate(df: pd.DataFrame, lengths: Sequence[int], cfg: Config, causal: bool,
               window: int | None) -> float:
    """The Sink rate of uniform attention on the same sequences and heads (each head's
    uniform alpha_1 from its layer's span), per sequence, averaged."""
    kinds = df.drop_duplicates(["layer", "head"])
    spans = kinds.layer_type if "layer_type" in kinds.columns else ["global"] * len(kinds)
    per_seq = []
    for n in lengths:
        sinks = [uniform_alpha(n, causal, window if kind == "sliding" else None) > cfg.eps
                 for kind in spans]
        per_seq.append(100 * float(np.mean(sinks)))
    return float(np.mean(per_seq))


def sink_rates(per_prompt: pd.DataFrame, cfg: Config, *,
               lengths: dict[str, Sequence[int]] | None = None, causal: bool = True,
               window: int | None = None) -> pd.DataFrame:
    """Sink_1^eps per input and layer group: the percentage of the group's heads with
    alpha_1 > eps, per sequence, averaged over sequences (Gu et al. 2024).

    Args:
        per_prompt: per-prompt ``first_token`` rows (``input``, ``prompt``, ``layer``,
            ``head``, ``score``; with ``layer_type``, each layer type is rated alone too).
        cfg: ``eps``, ``n_boot`` and ``seed``.
        lengths: each input's sequence lengths, for the uniform null (``NaN`` without).
        causal: whether the model is causal (the null's visible keys).
        window: the model's sliding window (``None``: no sliding layer).

    Returns:
        One row per input and group (``all`` first; ``sliding`` and ``global`` when the
        model has both), the columns of ``sink_rates`` in ``tables.py``.
    """
    rows = []
    alpha = per_prompt[per_prompt.metric == "first_token"]
    for name, by_input in alpha.groupby("input", sort=False):
        for group, df in _layer_groups(by_input):
            per_seq = (df.score > cfg.eps).groupby(df.prompt).mean().to_numpy() * 100
            low, high = bootstrap_mean_ci(per_seq[:, None], n_boot=cfg.n_boot, seed=cfg.seed)
            mean_alpha = df.groupby(["layer", "head"]).score.mean()
            null = float("nan") if lengths is None else \
                _null_rate(df, lengths[name], cfg, causal, window)
            rows.append({"input": name, "layers": group, "eps": cfg.eps,
                         "sink_rate": float(per_seq.mean()),
                         "ci_low": float(low[0]), "ci_high": float(high[0]),
                         "null_rate": null,
                         "sink_rate_mean_alpha": float((mean_alpha > cfg.eps).mean() * 100),
                         "mean_alpha": float(df.score.mean()),
                         "n_prompts": len(per_seq), "n_heads": len(mean_alpha)})
    return pd.DataFrame(rows)


def all_layers(rates: pd.DataFrame) -> pd.DataFrame:
    """The rows of a ``sink_rates`` table over every layer (a run written before layer
    groups has only those)."""
    return rates[rates.layers == "all"] if "layers" in rates.columns else rates


def top_receivers(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """For each input, layer and rank: how often the key ranked there is of each token type."""
    frames = []
    for rank in TOP_RANKS:
        kinds = per_prompt[per_prompt.metric == f"top{rank}_type"]
        shares = per_prompt[per_prompt.metric == f"top{rank}_share"]
        both = kinds.merge(shares, on=["input", "prompt", "layer", "head"],
                           suffixes=("_type", "_share"))
        both = both[both.score_type != PADDED]
        both["token_type"] = [TOKEN_TYPES[int(c)] for c in both.score_type]
        grouped = both.groupby(["input", "layer", "token_type"], sort=False)
        out = grouped.agg(count=("score_share", "size"), mean_share=("score_share", "mean"))
        out = out.reset_index()
        out["fraction"] = out["count"] / out.groupby(["input", "layer"])["count"].transform("sum")
        out["rank"] = rank
        frames.append(out)
    return pd.concat(frames, ignore_index=True)[
        ["input", "layer", "rank", "token_type", "fraction", "mean_share", "count"]]


def summarize_inputs(per_prompt: pd.DataFrame, cfg: Config) -> pd.DataFrame:
    """Mean over prompts with bootstrap intervals, per input and (layer, head, metric).

    One metric at a time: the bootstrap holds ``n_boot x prompts x heads`` numbers, and
    with every metric at once that is gigabytes. The resamples depend only on the seed and
    the number of prompts, so the intervals are the same either way.
    """
    numeric = per_prompt[~per_prompt.metric.isin(CATEGORICAL)]
    frames = []
    for (name, _), df in numeric.groupby(["input", "metric"], sort=False):
        out = summarize(df.drop(columns="input"), n_boot=cfg.n_boot, seed=cfg.seed)
        out.insert(0, "input", name)
        frames.append(out)
    keys = ["input", "layer", "head", "metric"]
    order = {name: i for i, name in enumerate(numeric.input.unique())}
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(keys, key=lambda c: c.map(order) if c.name == "input" else c,
                           ignore_index=True)


def sink_classes(model: Model, natural: Sequence[Prompt], per_prompt: pd.DataFrame,
                 cfg: Config) -> pd.DataFrame:
    """Every head tested for the sink class on the natural input: alpha_1 above ``eps``
    (Gu et al.'s threshold is the null) and above uniform attention, at ``fdr`` over the
    model's heads (:mod:`workbench.scores.classes`; no further forward pass)."""
    alpha = per_prompt[(per_prompt.input == "natural") & (per_prompt.metric == "first_token")]
    chance = reductions.layer_nulls(model, natural, metrics.reductions("first_token"))
    testing = classes.Testing(fdr=cfg.fdr, n_draws=cfg.n_null_draws, seed=cfg.seed, eps=cfg.eps)
    return classes.classify(classes.get("sink"), alpha.drop(columns="input"), cfg.eps,
                            testing=testing, n_boot=cfg.n_boot, seed=cfg.seed,
                            inputs="natural", chance=chance.drop(columns="metric"))


def massive_by_layer(resid: pd.DataFrame) -> pd.DataFrame:
    """:func:`~workbench.recording.residuals.massive_by_boundary` per input, with the
    tokens that hold the largest activation and the share of sequences of each."""
    out = massive_by_boundary(resid, by=["input"])
    top1 = resid[resid["rank"] == 1]
    tokens = top1.groupby(["input", "layer"]).token.agg(
        lambda t: ", ".join(f"{tok!r} {share:.0%}"
                            for tok, share in t.value_counts(normalize=True).items()))
    out.insert(out.columns.get_loc("median_abs") + 1, "top1_tokens",
               [tokens[key] for key in zip(out.input, out.layer, strict=True)])
    return out


def relate_to_sink(massive: pd.DataFrame, scores: pd.DataFrame, eps: float) -> pd.DataFrame:
    """Add ``sink_head_share``: the share of layer l's heads whose mean alpha_1 exceeds
    ``eps``, next to boundary l (the residual stream that layer l reads)."""
    sink = scores[scores.metric == "first_token"]
    share = (sink.score > eps).groupby([sink.input, sink.layer]).mean()
    share = share.rename("sink_head_share").reset_index()
    return massive.merge(share, on=["input", "layer"], how="left")


def sink_massive_correlation(massive: pd.DataFrame, input_name: str) -> float:
    """Pearson correlation over layers of log10(top1 / median) and the share of sink heads."""
    df = massive[(massive.input == input_name) & massive.sink_head_share.notna()]
    if len(df) < 3 or df.sink_head_share.nunique() < 2:
        return float("nan")
    return float(np.corrcoef(np.log10(df.ratio), df.sink_head_share)[0, 1])


# ---- the result -------------------------------------------------------------------------

@dataclass
class Result:
    """Everything measured; see the package docstring for each table's definitions."""

    model: str
    causal: bool
    cfg: Config
    input_scores: pd.DataFrame
    rates: pd.DataFrame
    receivers: pd.DataFrame
    sink_per_prompt: pd.DataFrame
    massive: pd.DataFrame
    massive_detail: pd.DataFrame
    repeated: pd.DataFrame | None
    streaming: pd.DataFrame | None
    stream_losses: pd.DataFrame | None
    skipped: dict[str, str]
    head_classes: pd.DataFrame | None = None
    window_edge: pd.DataFrame | None = None
    edge_destinations: pd.DataFrame | None = None

    def tables(self) -> dict[str, pd.DataFrame]:
        natural = self.input_scores[self.input_scores.input == "natural"]
        out = {"head_scores": natural.drop(columns="input").reset_index(drop=True),
               "input_scores": self.input_scores, "sink_rates": self.rates,
               "top_receivers": self.receivers, "sink_per_prompt": self.sink_per_prompt,
               "massive_activations": self.massive,
               "massive_activations_detail": self.massive_detail,
               "skipped": pd.DataFrame(list(self.skipped.items()),
                                       columns=["part", "reason"])}
        if self.repeated is not None:
            out["repeated_token_check"] = self.repeated
        if self.streaming is not None and self.stream_losses is not None:
            out["streaming_perplexity"] = self.streaming
            out["streaming_losses"] = self.stream_losses
        if self.head_classes is not None:
            out["head_classes"] = self.head_classes
        if self.window_edge is not None and self.edge_destinations is not None:
            out["window_edge"] = self.window_edge
            out["edge_destinations"] = self.edge_destinations
        return out

    def summary(self) -> list[str]:
        lines = [_rates_line(all_layers(self.rates), self.cfg)]
        if "layers" in self.rates.columns and (self.rates.layers != "all").any():
            lines.append(_layer_groups_line(self.rates))
        if self.head_classes is not None:
            lines.append(classes.summary_line(self.head_classes, "sink"))
        lines += _bos_lines(self.input_scores) if "bos" not in self.skipped else \
            [f"with/without BOS: skipped ({self.skipped['bos']})"]
        if not self.causal:
            lines += _encoder_lines(self.input_scores)
        lines.append(_massive_line(self.massive, self.cfg))
        if self.repeated is not None:
            worst = self.repeated.loc[self.repeated.relative_deviation.idxmax()]
            lines.append(
                f"repeated-token property: max_t |h_t - h_0| = {worst.max_abs_deviation:.3g} "
                f"at boundary {int(worst.layer)} (relative to max |h| = "
                f"{worst.relative_deviation:.2g}) over {int(worst.n_prompts)} sequences")
        else:
            lines.append(f"repeated-token property: skipped ({self.skipped['repeated']})")
        if self.streaming is not None:
            lines.append(_streaming_line(self.streaming, self.cfg))
        else:
            lines.append(f"streaming perplexity: skipped ({self.skipped['streaming']})")
        if self.edge_destinations is not None:
            lines.append(_edge_line(self.edge_destinations, self.cfg))
        elif "window_edge" in self.skipped:
            lines.append(f"window edge: skipped ({self.skipped['window_edge']})")
        return lines


def _layer_groups_line(rates: pd.DataFrame) -> str:
    """The natural-text sink rate of each layer type beside the uniform null."""
    natural = rates[(rates.input == rates.input.iloc[0]) & (rates.layers != "all")]
    parts = [f"{r.layers} layers {r.sink_rate:.1f}% [{r.ci_low:.1f}, {r.ci_high:.1f}] of "
             f"{int(r.n_heads)} heads (uniform null {r.null_rate:.1f}%)"
             for r in natural.itertuples()]
    return f"sink rate by layer type ({natural.input.iloc[0]}): " + "; ".join(parts)


def _edge_line(table: pd.DataFrame, cfg: Config) -> str:
    """How many sliding heads send their lost first-token mass to each destination."""
    sliding = table[table.layer_type == "sliding"]
    counts = sliding.destination.value_counts()
    lost = sliding.lost.sum()
    # every sliding head, weighted by the mass it loses: sum(lost * share) / sum(lost)
    weighted = ", ".join(
        f"{(sliding.lost * sliding[c]).sum() / lost:.0%} {w}" for c, w in
        (("to_edge", "to the window's first key"), ("to_diagonal", "to the diagonal"),
         ("spread", "spread"))) if lost > 0 else "nothing lost"
    return (f"window edge ({cfg.edge_prompts} documents, {cfg.edge_queries} queries each "
            f"side): of {len(sliding)} sliding heads, "
            + ", ".join(f"{counts.get(d, 0)} {d}" for d in ("edge", "diagonal", "spread",
                                                            "no sink"))
            + f" (a sink: alpha_1 > {cfg.eps:g} on the queries still in reach, largest "
            f"{sliding.first_in.max():.3f}); the first-token mass they lose at the edge "
            f"(mean {sliding.lost.mean():.3f} a head) goes, weighted by it: {weighted}")


def _rates_line(rates: pd.DataFrame, cfg: Config) -> str:
    parts = [f"{r.input} {r.sink_rate:.1f}% [{r.ci_low:.1f}, {r.ci_high:.1f}]"
             for r in rates.itertuples()]
    return (f"sink rate Sink_1^{cfg.eps:g} (% of heads with alpha_1 > {cfg.eps:g}, per "
            f"sequence, T = {cfg.seq_len}, {int(rates.n_prompts.iloc[0])} sequences): "
            + "; ".join(parts))


def _mean_share(scores: pd.DataFrame, name: str, metric: str) -> float:
    picked = scores[(scores.input == name) & (scores.metric == metric)]
    return float(picked.score.mean()) if len(picked) else float("nan")


def _bos_lines(scores: pd.DataFrame) -> list[str]:
    """Does the sink move to the first content token when there is no BOS?"""
    lines = []
    for kind in KINDS:
        if f"{kind}_no_bos" not in set(scores.input):
            continue
        with_bos = _mean_share(scores, kind, "share_bos")
        first_with = _mean_share(scores, kind, "share_first_content")
        first_without = _mean_share(scores, f"{kind}_no_bos", "first_token")
        lines.append(
            f"{kind}, head mean: with BOS, the BOS receives {with_bos:.3f} of the attention "
            f"and the first content token {first_with:.3f}; without BOS the first content "
            f"token (now at position 0) receives {first_without:.3f}")
    return lines


def _encoder_lines(scores: pd.DataFrame) -> list[str]:
    natural = scores[scores.input == "natural"]
    by_layer = natural.groupby(["metric", "layer"]).score.mean()
    layers = sorted(natural.layer.unique())
    cells = [f"L{layer}: " + "/".join(f"{by_layer[(f'share_{t}', layer)]:.2f}"
                                      for t in ("cls", "sep", "punctuation"))
             for layer in layers]
    ent = natural[natural.metric == "normalized_entropy"]
    broad, focused = ent.nlargest(1, "score").iloc[0], ent.nsmallest(1, "score").iloc[0]
    return ["[CLS]/[SEP]/punctuation share of attention by layer (head mean, sentence pairs): "
            + "; ".join(cells),
            f"normalized attention entropy: broadest head L{broad['layer']}H{broad['head']} "
            f"({broad['score']:.2f}), most focused L{focused['layer']}H{focused['head']} "
            f"({focused['score']:.2f})"]


def _massive_line(massive: pd.DataFrame, cfg: Config) -> str:
    """Where the largest activations become massive, and how that goes with the sink."""
    natural = massive[massive.input == "natural"]
    peak = natural.loc[natural.ratio.idxmax()]
    hits = natural[is_massive(natural.top1, natural.ratio)]
    text = (f"massive activations (natural text): largest |h| / median |h| = {peak.ratio:.0f} "
            f"(|h| = {peak.top1:.3g}) at boundary {int(peak.layer)}, dim {int(peak.top1_dim)} "
            f"({peak.top1_dim_share:.0%} of sequences), on tokens {peak.top1_tokens}; ")
    if hits.empty:
        text += (f"no boundary has an activation > {MASSIVE_MAGNITUDE:g} and > "
                 f"{MASSIVE_RATIO:g}x the median")
    else:
        first = int(hits.layer.min())
        share = natural.set_index("layer").sink_head_share
        before = share[share.index < first].mean() if first > 0 else float("nan")
        text += (f"massive (> {MASSIVE_MAGNITUDE:g} and > {MASSIVE_RATIO:g}x median) from "
                 f"boundary {first} on; share of sink heads (mean alpha_1 > {cfg.eps:g}) in "
                 f"the layers before: {before:.0%}, from there on: "
                 f"{share[share.index >= first].mean():.0%}")
    return text + (f"; correlation over layers of log10(top1/median) at a layer's input with "
                   f"its share of sink heads: r = "
                   f"{sink_massive_correlation(massive, 'natural'):.2f}")


def _streaming_line(table: pd.DataFrame, cfg: Config) -> str:
    masks = table[table.variant != "recompute"]
    every = ", ".join(f"{r.label} {r.ppl:.2f}" for r in masks.itertuples())
    matched = ", ".join(f"{r.label} {r.ppl_matched:.2f}" for r in table.itertuples())
    return (f"streaming perplexity ({int(table.n_tokens.iloc[0])} tokens of Python docs, "
            f"W = {cfg.window}, masks at absolute positions): all targets: {every}; on the "
            f"{int(table.n_matched.iloc[0])} positions where recompute is evaluated: {matched}")
