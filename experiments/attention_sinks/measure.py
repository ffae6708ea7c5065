"""What attention-sinks measures: its inputs, per-head reductions, residual scans, streaming
perplexity, and the reductions over prompts (definitions in the package docstring)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import Prompt, random_token_ids
from workbench.inputs.sentences import sentence_pairs
from workbench.inputs.token_types import PADDED, TOKEN_TYPES, TokenTyper, model_token_types
from workbench.models.base import Model
from workbench.recording import reductions
from workbench.recording.residuals import (
    MASSIVE_MAGNITUDE,
    MASSIVE_RATIO,
    is_massive,
    massive_by_boundary,
    scan_residuals,
    spread_by_boundary,
)
from workbench.scores import classes, metrics, patterns
from workbench.scores.stats import bootstrap_mean_ci, summarize
from workbench.scores.streaming import (
    Visibility,
    recompute_losses,
    windowed_losses,
    windowed_losses_batched,
)
from workbench.store.schema import with_layer_types

if TYPE_CHECKING:
    from experiments.attention_sinks import Config

log = logging.getLogger(__name__)

InputKind = Literal["natural", "random", "repeated"]
KINDS: tuple[InputKind, ...] = ("natural", "random", "repeated")
TOP_RANKS = (1, 2, 3)
CATEGORICAL = tuple(f"top{r}_{w}" for r in TOP_RANKS for w in ("type", "position"))


# ---- per-head reductions ----------------------------------------------------------------

class _Received:
    """A block's share of r_j and the key types, computed once and read by several metrics.

    ``reduce_patterns`` calls every reduction with the same block of weights; holding a
    reference to it (so its id cannot be reused) is how a repeat is recognised.
    """

    def __init__(self, typer: TokenTyper) -> None:
        self.typer = typer
        self._inputs: tuple[Tensor, reductions.PatternContext] | None = None
        self._value: tuple[Tensor, Tensor] | None = None

    def __call__(self, pattern: Tensor, ctx: reductions.PatternContext
                 ) -> tuple[Float[Tensor, "batch head_index key_pos"],
                            Int[Tensor, "batch key_pos"]]:
        if self._inputs is None or self._inputs[0] is not pattern or self._inputs[1] is not ctx:
            self._inputs = (pattern, ctx)
            self._value = (patterns.received(pattern, ctx),
                           self.typer.codes(ctx.input_ids, ctx.query_mask))
        assert self._value is not None
        return self._value


def _ranked(rank: int, what: Literal["share", "type", "position"],
            codes: Int[Tensor, "batch key_pos"], r: Float[Tensor, "batch head_index key_pos"]
            ) -> Float[Tensor, "batch head_index"]:
    """The share, type code or position of the key receiving the ``rank``-th most weight."""
    values, index = r.topk(min(3, r.shape[-1]), dim=-1)
    if what == "share":
        return values[..., rank - 1]
    if what == "position":
        return index[..., rank - 1].float()
    return codes.gather(1, index[..., rank - 1]).float()


def sink_reductions(typer: TokenTyper, types: Sequence[str]) -> dict[str, reductions.Reduction]:
    """Every per-head metric of one scan, keyed by metric name: ``first_token``, ``entropy``,
    ``normalized_entropy``, ``share_<type>`` for each of ``types``, and
    ``top<r>_{share,type,position}`` (the share, type code and position of the key that
    receives the r-th most weight). Each is block-wise: a share is a sum over query
    blocks, and the ranking waits for every block's r_j."""
    shared = _Received(typer)

    def share_of(name: str) -> reductions.BlockReduction:
        code = TOKEN_TYPES.index(name)

        def part(pattern: Tensor, ctx: reductions.PatternContext) -> reductions.Total:
            r, codes = shared(pattern, ctx)
            return reductions.Total(patterns.received_by(r, codes == code))
        return reductions.BlockReduction(part, f"share_{name}")

    def top(rank: int, what: Literal["share", "type", "position"]) -> reductions.BlockReduction:
        def part(pattern: Tensor, ctx: reductions.PatternContext) -> reductions.KeyTotals:
            r, codes = shared(pattern, ctx)
            return reductions.KeyTotals(r, functools.partial(_ranked, rank, what, codes))
        return reductions.BlockReduction(part, f"top{rank}_{what}")

    out = metrics.reductions("first_token", "entropy", "normalized_entropy")
    out |= {f"share_{name}": share_of(name) for name in types}
    for rank in TOP_RANKS:
        for what in ("share", "type", "position"):
            out[f"top{rank}_{what}"] = top(rank, what)
    return out


# ---- inputs -----------------------------------------------------------------------------

def make_inputs(model: Model, kind: InputKind, cfg: Config) -> list[Prompt]:
    """``cfg.n_prompts`` prompts of one kind, framed as the model frames text."""
    if kind == "natural":
        if not model.info.causal:
            return sentence_pairs(model, cfg.n_prompts, cfg.seq_len, cfg.corpus_split)
        return token_chunks(model, python_docs(cfg.corpus_split), n_chunks=cfg.n_prompts,
                            n_tokens=cfg.seq_len, label="natural")
    special = len(model.frame([]))
    gen = torch.Generator().manual_seed(cfg.seed + KINDS.index(kind))
    prompts = []
    for i in range(cfg.n_prompts):
        if kind == "random":
            body = random_token_ids(model, cfg.seq_len - special, gen)
        else:
            body = random_token_ids(model, 1, gen) * (cfg.seq_len - special)
        prompts.append(Prompt(token_ids=tuple(model.frame(body)), label=f"{kind}[{i}]"))
    return prompts


def without_bos(model: Model, prompts: Sequence[Prompt]) -> list[Prompt]:
    """The same token ids with the leading BOS removed.

    Raises:
        WorkbenchError: a prompt does not start with the BOS.
    """
    bos = model.info.bos_token_id
    out = []
    for p in prompts:
        ids = model.encode(p)[0]
        if ids[0] != bos:
            raise WorkbenchError(f"prompt {p.label} does not start with the BOS token")
        out.append(Prompt(token_ids=tuple(ids[1:]), label=f"{p.label} (no BOS)"))
    return out


def input_sets(model: Model, cfg: Config) -> dict[str, list[Prompt]]:
    """Every input of the experiment by name: each kind, and each without BOS if asked."""
    sets: dict[str, list[Prompt]] = {}
    bos_comparison = cfg.compare_bos and model.info.causal and model.info.bos_token_id is not None
    for kind in KINDS:
        sets[kind] = make_inputs(model, kind, cfg)
        if bos_comparison:
            sets[f"{kind}_no_bos"] = without_bos(model, sets[kind])
    return sets


def skips(model: Model, cfg: Config) -> dict[str, str]:
    """``{part: reason}`` for the parts (``bos``, ``streaming``, ``repeated``) that do not
    apply to this model or config."""
    skipped = {}
    if not model.info.causal:
        skipped["bos"] = (f"{model.info.name} is an encoder: it has no BOS token ([CLS] is "
                          "its first token), so there is no with/without-BOS comparison")
    elif model.info.bos_token_id is None:
        skipped["bos"] = f"{model.info.name} prepends no BOS token to text"
    elif not cfg.compare_bos:
        skipped["bos"] = "compare_bos=false"
    if not (model.info.causal and model.info.has_lm_head):
        skipped["streaming"] = (f"{model.info.name} is not a causal LM with a trained head, so "
                                "it has no next-token perplexity to measure")
    elif not cfg.streaming:
        skipped["streaming"] = "streaming=false"
    elif cfg.stream_tokens > model.info.n_ctx:
        skipped["streaming"] = (f"stream_tokens={cfg.stream_tokens} exceeds the context "
                                f"of {model.info.n_ctx}")
    elif model.info.sliding_layers:
        skipped["streaming"] = (
            f"{model.info.name} has sliding-window layers: the variants hand every layer one "
            "4-D mask, which replaces a sliding layer's own window (dense would let its "
            f"queries see past their {model.info.sliding_window} keys, and the sinks would "
            "reach them from beyond it), so no variant is the model's own attention")
    elif model.info.positions == "alibi":
        skipped["streaming"] = (f"{model.info.name} builds its ALiBi biases from a 2-D "
                                "padding mask, so the window masks of the streaming variants "
                                "cannot be handed to it")
    if (why := _no_window_edge(model, cfg)) is not None:
        skipped["window_edge"] = why
    if model.info.positions == "alibi":
        skipped["repeated"] = (f"{model.info.name} adds ALiBi biases by position, so the "
                               "hidden states of a repeated token differ by design")
    elif model.info.positions != "rotary":
        skipped["repeated"] = (f"{model.info.name} adds learned absolute position embeddings, "
                               "so the hidden states of a repeated token differ by design")
    return skipped


def _no_window_edge(model: Model, cfg: Config) -> str | None:
    """Why the window-edge part does not apply, or ``None`` if it does."""
    info = model.info
    if not info.sliding_layers:
        return f"{info.name} has no sliding-window layer: the first token is always in reach"
    if not cfg.window_edge:
        return "window_edge=false"
    if not info.causal:
        return f"{info.name} is bidirectional: its window has no first token to lose"
    length = edge_length(info.sliding_window, cfg.edge_queries)
    if length > info.n_ctx:
        return (f"documents of window + edge_queries = {length} tokens exceed the context "
                f"of {info.n_ctx}")
    if cfg.edge_queries > info.sliding_window:
        return (f"edge_queries={cfg.edge_queries} exceeds the window of "
                f"{info.sliding_window}: there are not as many queries in reach")
    return None


# ---- scans ------------------------------------------------------------------------------

def scan_inputs(model: Model, sets: dict[str, list[Prompt]], cfg: Config
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-prompt head metrics and residual-stream extremes of every input set."""
    typer = TokenTyper.for_model(model)
    scores = sink_reductions(typer, model_token_types(model))
    per_prompt, resid = [], []
    for name, prompts in progress.track(list(sets.items()), desc="inputs"):
        log.info("scanning %s (%d prompts)", name, len(prompts))
        scored = reductions.reduce_patterns(model, prompts, scores,
                                            max_batch_tokens=cfg.max_batch_tokens, desc=name)
        per_prompt.append(with_layer_types(scored, model.info.layer_types).assign(input=name))
        extremes = scan_residuals(model, prompts[: cfg.n_massive_prompts],
                                  max_batch_tokens=cfg.max_batch_tokens)
        resid.append(_with_token_types(model, typer, extremes, prompts).assign(input=name))
    return pd.concat(per_prompt, ignore_index=True), pd.concat(resid, ignore_index=True)


def _with_token_types(model: Model, typer: TokenTyper, resid: pd.DataFrame,
                      prompts: Sequence[Prompt]) -> pd.DataFrame:
    """Add the token (string and type) at each activation's position."""
    ids = {i: model.encode(prompts[i])[0] for i in resid.prompt.unique()}
    strings = {i: model.str_tokens(row) for i, row in ids.items()}
    kinds = {i: typer.names(row) for i, row in ids.items()}
    where = list(zip(resid.prompt, resid.position, strict=True))
    return resid.assign(token=[strings[p][t] for p, t in where],
                        token_type=[kinds[p][t] for p, t in where])


def repeated_check(resid: pd.DataFrame, sets: dict[str, list[Prompt]], model: Model,
                   skipped: dict[str, str]) -> pd.DataFrame | None:
    """The repeated-token check on the prompts that are one repeated token alone, or
    ``None`` (and the reason added to ``skipped``) when there are none or it does not apply."""
    if "repeated" in skipped:
        return None
    name = "repeated_no_bos" if "repeated_no_bos" in sets else "repeated"
    if model.info.causal and model.info.bos_token_id is not None and name == "repeated":
        skipped["repeated"] = "compare_bos=false, so no input is one repeated token alone"
        return None
    return spread_by_boundary(resid[resid.input == name])


# ---- streaming perplexity ---------------------------------------------------------------

def stream_ids(model: Model, cfg: Config) -> Int[Tensor, " pos"]:
    """The streamed text: the Python docs' prose, BOS first, ``cfg.stream_tokens`` long."""
    chunk = token_chunks(model, ["\n\n".join(python_docs(cfg.corpus_split))], n_chunks=1,
                         n_tokens=cfg.stream_tokens, label="stream")[0]
    return torch.tensor(chunk.token_ids)


def _ppl(nll: np.ndarray) -> float:
    return float(np.exp(nll.mean())) if len(nll) else float("nan")


def _variants(cfg: Config) -> list[tuple[str, Visibility]]:
    out = [("dense", Visibility()), ("window", Visibility(0, cfg.window))]
    out += [("sinks+window", Visibility(k, cfg.window))
            for k in sorted({cfg.n_sinks, *cfg.sink_sweep})]
    return out


def measure_streaming(model: Model, cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Perplexity of one long text under every attention variant.

    Returns:
        ``(table, losses)``: one row per variant (see :func:`_streaming_row`), and the loss
        of every evaluated target, ``variant, label, n_sinks, position, nll`` (``position``
        is the query position ``t``; the target is token ``t + 1``).
    """
    ids = stream_ids(model, cfg)
    variants = _variants(cfg)
    # the windowed variants run as one batch (one shared cache: the sinks, the last W keys
    # and the chunk); dense runs alone, since in a batch it would keep every key for every row
    dense = [windowed_losses(model, ids, variants[0][1], chunk=cfg.chunk, desc="stream dense")]
    windows = windowed_losses_batched(model, ids, [vis for _, vis in variants[1:]],
                                      chunk=cfg.chunk, desc="stream windows")
    frames = []
    for (variant, vis), nll in zip(variants, [*dense, *windows], strict=True):
        frames.append(pd.DataFrame({"variant": variant, "label": vis.label,
                                    "n_sinks": vis.n_sinks, "position": np.arange(len(nll)),
                                    "nll": nll.numpy()}))
    sample = list(range(cfg.window, len(ids) - 1, cfg.recompute_stride))
    nll = recompute_losses(model, ids, cfg.window, sample,
                           max_batch_tokens=cfg.max_batch_tokens)
    frames.append(pd.DataFrame({"variant": "recompute", "label": f"recompute {cfg.window}",
                                "n_sinks": 0, "position": sample, "nll": nll.numpy()}))
    losses = pd.concat(frames, ignore_index=True)
    table = pd.DataFrame([_streaming_row(g, cfg, sample, len(ids))
                          for _, g in losses.groupby("label", sort=False)])
    return table.astype({"window": "Int64"}), losses


def _streaming_row(losses: pd.DataFrame, cfg: Config, sample: list[int], n_tokens: int
                   ) -> dict:
    """Perplexities of one variant: all targets, targets past the window, the common sample."""
    first = losses.iloc[0]
    recompute = first.variant == "recompute"
    by_pos = losses.set_index("position").nll
    matched = by_pos.reindex(sample).to_numpy()
    low, high = bootstrap_mean_ci(matched[:, None], n_boot=cfg.n_boot, seed=cfg.seed)
    return {
        "variant": first.variant, "label": first.label, "n_sinks": int(first.n_sinks),
        "window": None if first.variant == "dense" else cfg.window,
        "positions": "fresh window" if recompute else "absolute",
        "ppl": float("nan") if recompute else _ppl(by_pos.to_numpy()),
        "ppl_beyond_window": float("nan") if recompute
        else _ppl(by_pos[by_pos.index >= cfg.window].to_numpy()),
        "ppl_matched": _ppl(matched), "matched_low": float(np.exp(low[0])),
        "matched_high": float(np.exp(high[0])), "n_matched": len(sample),
        "n_targets": len(by_pos), "n_tokens": n_tokens,
    }


# ---- the window edge ----------------------------------------------------------------------

EDGE_MEASURES = ("first_in", "first_out", "diagonal_in", "diagonal_out", "edge_out",
                 "neighbour_out", "beyond_out")
"""The per-head measures of the window edge, in the order the table stores them."""
Destination = Literal["edge", "diagonal", "spread", "no sink", "kept"]
HALF = 0.5
"""The share of the lost first-token mass one destination must take to be named."""


def edge_length(window: int, n: int) -> int:
    """Tokens of a window-edge document (BOS included): the window, then ``n`` queries
    past it."""
    return window + n


def edge_reductions(window: int, n: int) -> dict[str, reductions.BlockReduction]:
    """The measures of :data:`EDGE_MEASURES` as block reductions, each a mean over the
    ``n`` queries just before the edge (``_in``: ``W - n <= t < W``, the last that still
    see position 0 through a window of ``W`` keys) or just after it (``_out``:
    ``W <= t < W + n``, the first that do not)."""

    def over(rows: Literal["in", "out"], value) -> reductions.BlockReduction:
        lo, hi = (window - n, window) if rows == "in" else (window, window + n)

        def per_query(pattern: Tensor, ctx: reductions.PatternContext):
            q = ctx.queries
            counted = ctx.real_queries & ((q >= lo) & (q < hi))[None, :]
            return value(pattern, ctx), counted
        return reductions.query_mean(per_query)

    def first(pattern: Tensor, ctx: reductions.PatternContext) -> Tensor:
        values = pattern.float()[..., 0]
        return values if ctx.k0 == 0 else torch.zeros_like(values)

    def at(offset: int):
        return lambda pattern, ctx: patterns.weight_at(pattern, ctx, offset)

    def beyond(pattern: Tensor, ctx: reductions.PatternContext) -> Tensor:
        # keys further back than the window: k <= t - W (none of them in a sliding layer)
        far = ctx.keys(pattern.shape[-1])[None, :] <= (ctx.queries - window)[:, None]
        return (pattern.float() * far).sum(-1)

    return {"first_in": over("in", first), "first_out": over("out", first),
            "diagonal_in": over("in", at(0)), "diagonal_out": over("out", at(0)),
            "edge_out": over("out", at(-(window - 1))),
            "neighbour_out": over("out", at(-(window - 2))),
            "beyond_out": over("out", beyond)}


def edge_inputs(model: Model, cfg: Config) -> list[Prompt]:
    """``cfg.edge_prompts`` consecutive windows of the Python docs' prose, each
    :func:`edge_length` tokens long with its BOS."""
    return token_chunks(model, python_docs(cfg.corpus_split), n_chunks=cfg.edge_prompts,
                        n_tokens=edge_length(model.info.sliding_window, cfg.edge_queries),
                        label="edge")


def measure_window_edge(model: Model, cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where a sliding layer's first-token mass goes once the first token is out of reach
    (the package docstring defines every measure).

    Returns:
        ``(window_edge, edge_destinations)``: each measure of every head with its
        bootstrap interval over documents, and each head's destination.
    """
    info = model.info
    prompts = edge_inputs(model, cfg)
    per_prompt = reductions.reduce_patterns(
        model, prompts, edge_reductions(info.sliding_window, cfg.edge_queries),
        max_batch_tokens=max(cfg.max_batch_tokens, edge_length(info.sliding_window,
                                                               cfg.edge_queries)),
        desc="window edge")
    table = summarize(per_prompt, n_boot=cfg.n_boot, seed=cfg.seed).rename(
        columns={"metric": "measure"})
    table = with_layer_types(table, info.layer_types)
    order = {m: i for i, m in enumerate(EDGE_MEASURES)}
    table = table.sort_values(["layer", "head", "measure"], key=lambda c: c.map(order)
                              if c.name == "measure" else c, ignore_index=True)
    return table, destinations(table, cfg.eps)


def destinations(table: pd.DataFrame, eps: float) -> pd.DataFrame:
    """Each head's destination of the lost first-token mass, from its ``window_edge`` means
    (the package docstring's definitions)."""
    wide = table.pivot_table(index=["layer", "head", "layer_type"], columns="measure",
                             values="score").reset_index()
    lost = wide.first_in - wide.first_out
    with np.errstate(divide="ignore", invalid="ignore"):
        to_edge = (wide.edge_out - wide.neighbour_out) / lost
        to_diagonal = (wide.diagonal_out - wide.diagonal_in) / lost
    out = pd.DataFrame({"layer": wide.layer.astype("int64"), "head": wide["head"].astype("int64"),
                        "layer_type": wide.layer_type, "first_in": wide.first_in,
                        "lost": lost, "to_edge": to_edge, "to_diagonal": to_diagonal,
                        "spread": 1 - to_edge - to_diagonal})
    out["destination"] = [_destination(r, eps) for r in out.itertuples()]
    return out


def _destination(row, eps: float) -> Destination:
    if row.layer_type == "global":
        return "kept"
    if not row.first_in > eps:
        return "no sink"
    if row.to_edge >= HALF:
        return "edge"
    if row.to_diagonal >= HALF:
        return "diagonal"
    return "spread"


# ---- summaries over prompts -------------------------------------------------------------

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
