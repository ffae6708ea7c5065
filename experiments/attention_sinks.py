"""Attention sinks: where attention mass lands, and what evicting the sink from the window costs.

Question: a large share of attention in trained transformers lands on the first token or on
delimiters that carry no meaning, because the softmax must spend its mass somewhere. How
much, in which heads, on which inputs, with which residual-stream signature; and does a
causal LM still model text when its sink is evicted from the attention window?

Papers and definitions (``A[t, j]`` is a head's weight from query ``t`` to key ``j``, over
the ``T`` real tokens of a prompt; our positions count from 0, the papers' from 1):

- ``sink`` (``head_scores``): alpha_1 = (1/T) sum_t A[t, 0], the mean weight on the first
  position over all queries (Gu et al. 2024, "When Attention Sink Emerges in Language
  Models: An Empirical View", section 3.2, their alpha_1^{l,h}).
- Sink rate Sink_1^eps (``sink_rates``): the percentage of (layer, head) pairs with
  alpha_1 > eps, computed per sequence and averaged over sequences, as in Gu et al.'s
  released code (``eval_sink_open_source.py``). Their protocol, the default here: eps = 0.3,
  T = 64, about 100 sequences. ``sink_rate_mean_alpha`` applies the threshold to alpha_1
  averaged over the sequences instead (what the heatmap shows). Gu et al. Table 1 reports it
  for natural text, random tokens and a repeated token side by side.
- Inputs: ``natural`` (consecutive 64-token windows of the Python documentation's prose;
  for encoders, pairs of consecutive sentences framed ``[CLS] a [SEP] b [SEP]`` as in Clark
  et al. 2019), ``random`` (uniform token ids from the middle of the vocabulary,
  :func:`workbench.inputs.prompts.random_token_ids`), ``repeated`` (one such token repeated). Causal
  models see each with their BOS, as they frame text, and again without it (``*_no_bos``:
  the same tokens minus the BOS, so that the first content token moves to position 0).
- Where the mass goes: the weight a key receives, r_j = (1/T) sum_t A[t, j] (alpha_j for
  every key, so r_0 = alpha_1), summed over keys of each token type: ``bos``, ``cls``,
  ``sep`` (special tokens by id), ``first_content`` (the first non-special token),
  ``newline`` (a token containing a line break), ``punctuation`` (a token made only of
  Unicode punctuation), ``other``. The types are exclusive, in that order of precedence, so
  the shares of a head sum to 1. ``top{1,2,3}_share`` is the weight received by the key
  ranked first, second and third by r_j; ``top_receivers`` says which token types those
  keys are.
- ``entropy``, ``normalized_entropy``: the attention entropy of each head, to separate
  broad from focused heads (Clark et al. 2019, "What Does BERT Look At?", section 3.4).
- Massive activations (Sun et al. 2024, "Massive Activations in Large Language Models",
  section 2): per layer boundary of the residual stream, the three largest |h[t, d]| with
  their position and dimension, against the median |h| of the prompt. Sun et al. call an
  activation massive when it exceeds 100 and is about 1,000 times the median.
- The repeated-token property (Gu et al., appendix C, Propositions 1-4): without absolute
  position embeddings, a sequence of one repeated token has every value vector equal, so
  every attention output, and every hidden state, is the same at every position whatever
  the weights. ``repeated_token_check`` reports max_t |h_t - h_0| per boundary on the
  ``repeated_no_bos`` prompts; it should be float round-off (and it catches a hook or mask
  that treats positions differently).
- Streaming (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks",
  Table 1 and Figure 3): perplexity of one long text when each token may attend to the full
  prefix (``dense``), the last W tokens (``window``, ``0+W``), the first k tokens plus the
  last W - k (``k+(W-k)``), and a fresh forward pass over the last W tokens for each
  prediction (``recompute``, the reference). Windows are attention masks over the full
  sequence at absolute positions (:mod:`workbench.scores.streaming`), not Xiao et al.'s rolling
  cache that re-numbers positions inside the cache: with rotary positions the two agree
  exactly for window attention, and for k sinks they differ only in the distance between a
  query and the sinks. Xiao et al. re-number because their streams run to millions of
  tokens, far past the trained context, where absolute distances would be out of
  distribution; our text is shorter than smollm2's 8192-token context, so every distance is
  one the model saw in training (dense attention sees the BOS at every distance up to
  8191), and the mask-based result is exact and checkable against one full forward pass.
  ``recompute`` is evaluated at every ``recompute_stride``-th position beyond the window
  (``ppl_matched`` compares every variant on exactly those positions). The streamed text is
  the first ``stream_tokens`` tokens of the same prose (topics in name order, blank lines
  between them), after the BOS.

Tables: ``head_scores`` (natural input; ``layer, head, metric, score, ci_low, ci_high,
n_prompts`` for ``sink``, ``share_*``, ``top{r}_share``, ``entropy``, ``normalized_entropy``),
``input_scores`` (the same for every input, with an ``input`` column), ``sink_rates``,
``sink_per_prompt``, ``top_receivers`` (``input, layer, rank, token_type, fraction,
mean_share``), ``massive_activations`` (per input and boundary: median over sequences of the
top-3 magnitudes and of the median, the ratio, the usual position, dimension and tokens of
the largest, and ``sink_head_share`` of the layer reading that boundary),
``massive_activations_detail`` (per sequence), ``repeated_token_check``,
``streaming_perplexity`` (per variant: ``ppl`` over all targets, ``ppl_beyond_window`` over
the targets at positions >= W, ``ppl_matched`` with a bootstrap interval) and
``streaming_losses`` (the loss of every evaluated target).

Encoders (minilm) get everything except the BOS comparison and streaming perplexity, which
need a BOS token and a trained causal LM head; the summary says so.

Example:
    workbench run attention-sinks --model smollm2
    workbench run attention-sinks --model minilm --set n_prompts=32
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.harness.claims import Measurement, claim_check
from workbench.harness.experiment import Context, experiment
from workbench.inputs.batching import make_batches
from workbench.inputs.corpus import Split, python_docs, token_chunks
from workbench.inputs.prompts import Prompt, random_token_ids
from workbench.models.base import Model
from workbench.recording import hooks, reductions
from workbench.scores import patterns
from workbench.scores.stats import bootstrap_mean_ci, summarize
from workbench.scores.streaming import Visibility, recompute_losses, windowed_losses
from workbench.store.runs import Run

log = logging.getLogger(__name__)

InputKind = Literal["natural", "random", "repeated"]
KINDS: tuple[InputKind, ...] = ("natural", "random", "repeated")
TOKEN_TYPES = ("bos", "cls", "sep", "first_content", "newline", "punctuation", "other")
TOP_RANKS = (1, 2, 3)
PADDED = -1


@dataclass(frozen=True)
class Config:
    n_prompts: int = field(default=100, metadata={
        "help": "sequences per input kind (Gu et al.: about 100)"})
    seq_len: int = field(default=64, metadata={
        "help": "tokens per sequence, special tokens included (Gu et al.: T = 64)"})
    eps: float = field(default=0.3, metadata={
        "help": "sink threshold on alpha_1 (Gu et al.: 0.3)"})
    corpus_split: Split = field(default="all", metadata={
        "help": "part of the Python documentation used as natural text"})
    compare_bos: bool = field(default=True, metadata={
        "help": "causal models: also run every input without its BOS token"})
    n_massive_prompts: int = field(default=20, metadata={
        "help": "sequences per input kind scanned for massive activations"})
    streaming: bool = field(default=True, metadata={
        "help": "causal LMs: measure streaming perplexity with and without sinks"})
    stream_tokens: int = field(default=4096, metadata={
        "help": "length of the streamed text in tokens, BOS included"})
    window: int = field(default=256, metadata={
        "help": "W: keys a query may see in the window variants (sinks included)"})
    n_sinks: int = field(default=4, metadata={
        "help": "k: initial tokens kept by the main sink + window variant (Xiao et al.: 4)"})
    sink_sweep: tuple[int, ...] = field(default=(1, 2, 8), metadata={
        "help": "further values of k to measure, e.g. 1,2,8"})
    recompute_stride: int = field(default=16, metadata={
        "help": "the recompute reference is evaluated at every n-th position past W"})
    chunk: int = field(default=256, metadata={
        "help": "queries per forward pass in streaming (speed only)"})
    n_boot: int = field(default=1000, metadata={"help": "bootstrap resamples for intervals"})
    seed: int = field(default=0, metadata={"help": "seed of random inputs and bootstrap"})
    max_batch_tokens: int = field(default=2048, metadata={"help": "tokens per forward batch"})

    def __post_init__(self) -> None:
        if self.n_prompts < 2 or self.n_massive_prompts < 1:
            raise ValueError("n_prompts must be >= 2 and n_massive_prompts >= 1")
        if self.seq_len < 4:
            raise ValueError(f"seq_len must be >= 4, got {self.seq_len}")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must lie in (0, 1), got {self.eps}")
        sinks = (self.n_sinks, *self.sink_sweep)
        if min(sinks) < 1 or max(sinks) >= self.window:
            raise ValueError(f"every sink count must be in 1..window-1 ({self.window - 1}); "
                             f"got n_sinks={self.n_sinks}, sink_sweep={self.sink_sweep}")
        if self.stream_tokens <= self.window + 1:
            raise ValueError(f"stream_tokens ({self.stream_tokens}) must exceed window + 1 "
                             f"({self.window + 1}), or no token ever loses its sink")
        if min(self.recompute_stride, self.chunk, self.n_boot, self.max_batch_tokens) < 1:
            raise ValueError("recompute_stride, chunk, n_boot and max_batch_tokens must be "
                             "positive")


# ---- token types ------------------------------------------------------------------------

def _is_punctuation(token: str) -> bool:
    text = token.strip()
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def _token_type_table(model: Model) -> Int[Tensor, " vocab"]:
    """Position-independent type code (index into TOKEN_TYPES) of every token id."""
    tok = model.tokenizer
    strings = model.str_tokens(list(range(len(tok))))
    codes = torch.full((len(strings),), TOKEN_TYPES.index("other"), dtype=torch.long)
    for i, text in enumerate(strings):
        if "\n" in text:
            codes[i] = TOKEN_TYPES.index("newline")
        elif _is_punctuation(text):
            codes[i] = TOKEN_TYPES.index("punctuation")
    for special in tok.all_special_ids:
        codes[special] = TOKEN_TYPES.index("other")
    named = {"bos": model.info.bos_token_id if model.info.causal else None,
             "cls": None if model.info.causal else tok.cls_token_id,
             "sep": None if model.info.causal else tok.sep_token_id}
    for name, token_id in named.items():
        if token_id is not None:
            codes[token_id] = TOKEN_TYPES.index(name)
    return codes


@dataclass(frozen=True)
class TokenTyper:
    """Type codes of the tokens of a batch (see the module docstring for the types)."""

    table: Int[Tensor, " vocab"]
    special: Bool[Tensor, " vocab"]

    @classmethod
    def for_model(cls, model: Model) -> TokenTyper:
        special = torch.zeros(len(model.tokenizer), dtype=torch.bool)
        special[list(model.tokenizer.all_special_ids)] = True
        return cls(_token_type_table(model), special)

    def codes(self, input_ids: Int[Tensor, "batch pos"], real: Bool[Tensor, "batch pos"]
              ) -> Int[Tensor, "batch pos"]:
        """Each position's type code; ``PADDED`` for padding."""
        codes = self.table[input_ids].clone()
        content = real & ~self.special[input_ids]
        first = content.float().argmax(-1)  # the first content position of each row
        rows = torch.arange(len(codes))[content.any(-1)]
        codes[rows, first[rows]] = TOKEN_TYPES.index("first_content")
        return codes.masked_fill(~real, PADDED)


# ---- per-head reductions ----------------------------------------------------------------

def received(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
             ctx: reductions.PatternContext) -> Float[Tensor, "batch head_index key_pos"]:
    """r_j = (1/T) sum_t A[t, j]: the mean weight each key receives over the real queries."""
    weights = ctx.query_mask[:, None, :, None].to(torch.float32)
    return (pattern.float() * weights).sum(-2) / ctx.lengths[:, None, None].float()


class _Received:
    """r_j and the key types of one layer, computed once and read by several metrics.

    ``reduce_patterns`` calls every reduction with the same pattern object for a layer;
    holding a reference to it (so its id cannot be reused) is how a repeat is recognised.
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
            self._value = (received(pattern, ctx), self.typer.codes(ctx.input_ids, ctx.query_mask))
        assert self._value is not None
        return self._value


def sink_reductions(typer: TokenTyper, types: Sequence[str]) -> dict[str, reductions.Reduction]:
    """Every per-head metric of one scan, keyed by metric name."""
    shared = _Received(typer)

    def share_of(code: int) -> reductions.Reduction:
        def reduce(pattern: Tensor, ctx: reductions.PatternContext) -> Tensor:
            r, codes = shared(pattern, ctx)
            return (r * (codes == code)[:, None, :]).sum(-1)
        return reduce

    def top(rank: int, what: Literal["share", "type", "position"]) -> reductions.Reduction:
        def reduce(pattern: Tensor, ctx: reductions.PatternContext) -> Tensor:
            r, codes = shared(pattern, ctx)
            values, index = r.topk(min(3, r.shape[-1]), dim=-1)
            if what == "share":
                return values[..., rank - 1]
            if what == "position":
                return index[..., rank - 1].float()
            return codes.gather(1, index[..., rank - 1]).float()
        return reduce

    metrics: dict[str, reductions.Reduction] = {
        "sink": patterns.first_token,
        "entropy": patterns.entropy,
        "normalized_entropy": patterns.normalized_entropy,
    }
    metrics |= {f"share_{name}": share_of(TOKEN_TYPES.index(name)) for name in types}
    for rank in TOP_RANKS:
        for what in ("share", "type", "position"):
            metrics[f"top{rank}_{what}"] = top(rank, what)
    return metrics


def model_token_types(model: Model) -> list[str]:
    """The token types that can occur for this model (no [CLS] in a decoder, no BOS in BERT)."""
    drop = {"cls", "sep"} if model.info.causal else {"bos"}
    if model.info.causal and model.info.bos_token_id is None:
        drop.add("bos")
    return [t for t in TOKEN_TYPES if t not in drop]


# ---- inputs -----------------------------------------------------------------------------

def _fit_pair(tokenizer: object, a: str, b: str, seq_len: int) -> tuple[str, str] | None:
    """Drop words from the end of the longer sentence until the pair fits ``seq_len``."""
    words_a, words_b = a.split(), b.split()
    while words_a and words_b:
        if len(tokenizer(" ".join(words_a), " ".join(words_b))["input_ids"]) <= seq_len:
            return " ".join(words_a), " ".join(words_b)
        longer = words_a if len(words_a) >= len(words_b) else words_b
        longer.pop()
    return None


def _sentence_pairs(model: Model, n: int, seq_len: int, split: Split) -> list[Prompt]:
    """Consecutive sentences of the Python docs' prose as ``[CLS] a [SEP] b [SEP]`` pairs,
    each cut to ``seq_len`` tokens at a word boundary (Clark et al. cut at 128 tokens)."""
    pairs: list[Prompt] = []
    for paragraph in (p for doc in python_docs(split) for p in doc.split("\n\n")):
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", paragraph) if len(s.split()) >= 3]
        for a, b in zip(sentences[::2], sentences[1::2], strict=False):
            if (fitted := _fit_pair(model.tokenizer, a, b, seq_len)) is not None:
                pairs.append(Prompt(text=fitted[0], pair=fitted[1], label=f"pair[{len(pairs)}]"))
            if len(pairs) == n:
                return pairs
    raise WorkbenchError(f"the corpus holds only {len(pairs)} sentence pairs; {n} were "
                         "requested")


def _frame(model: Model, body: list[int]) -> list[int]:
    """Token ids as the model frames text: BOS first (decoders) or [CLS] ... [SEP]."""
    if not model.info.causal:
        return [model.tokenizer.cls_token_id, *body, model.tokenizer.sep_token_id]
    bos = model.info.bos_token_id
    return body if bos is None else [bos, *body]


def make_inputs(model: Model, kind: InputKind, cfg: Config) -> list[Prompt]:
    """``cfg.n_prompts`` prompts of one kind, framed as the model frames text."""
    if kind == "natural":
        if not model.info.causal:
            return _sentence_pairs(model, cfg.n_prompts, cfg.seq_len, cfg.corpus_split)
        return token_chunks(model, python_docs(cfg.corpus_split), n_chunks=cfg.n_prompts,
                            n_tokens=cfg.seq_len, label="natural")
    special = len(_frame(model, []))
    gen = torch.Generator().manual_seed(cfg.seed + KINDS.index(kind))
    prompts = []
    for i in range(cfg.n_prompts):
        if kind == "random":
            body = random_token_ids(model, cfg.seq_len - special, gen)
        else:
            body = random_token_ids(model, 1, gen) * (cfg.seq_len - special)
        prompts.append(Prompt(token_ids=tuple(_frame(model, body)), label=f"{kind}[{i}]"))
    return prompts


def without_bos(model: Model, prompts: Sequence[Prompt]) -> list[Prompt]:
    """The same token ids with the leading BOS removed."""
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


# ---- residual stream: massive activations and the repeated-token property ----------------

def _resid_rows(x: Float[Tensor, "pos d_model"], prompt: int, boundary: int) -> list[dict]:
    """Top-3 |activation| of one prompt at one boundary, with position and dimension."""
    x = x.float()
    magnitude = x.abs()
    values, index = magnitude.reshape(-1).topk(3)
    median = float(magnitude.median())
    spread = float((x - x[0]).abs().max())  # repeated-token property: all rows equal
    return [{"prompt": prompt, "layer": boundary, "rank": rank + 1,
             "value": float(x.reshape(-1)[index[rank]]), "magnitude": float(values[rank]),
             "position": int(index[rank]) // x.shape[1], "dim": int(index[rank]) % x.shape[1],
             "median_abs": median, "spread": spread, "max_abs": float(values[0])}
            for rank in range(3)]


def scan_residuals(model: Model, prompts: Sequence[Prompt], *, max_batch_tokens: int = 2048
                   ) -> pd.DataFrame:
    """Largest residual-stream activations at every layer boundary of every prompt.

    Returns:
        One row per (prompt, layer boundary, rank 1..3): ``value`` (signed), ``magnitude``,
        ``position``, ``dim``, and per (prompt, boundary) ``median_abs`` (median |h| over
        positions and dimensions), ``max_abs`` and ``spread`` (max over positions and
        dimensions of |h[t] - h[0]|).
    """
    n_layers = model.info.n_layers
    encoded = [model.encode(p) for p in prompts]
    rows: list[dict] = []
    state: dict = {}

    def make_hook(boundary: int):
        def hook(resid: Tensor, hook: object) -> None:
            for row, (index, n) in enumerate(zip(state["indices"], state["lengths"],
                                                 strict=True)):
                rows.extend(_resid_rows(resid[row, :n], index, boundary))
        return hook

    fwd = [(hooks.resid(b, n_layers), make_hook(b)) for b in range(n_layers + 1)]
    pad = model.tokenizer.pad_token_id or 0
    with torch.inference_mode():
        for batch in make_batches(encoded, pad_id=pad, max_tokens=max_batch_tokens):
            state.update(indices=batch.indices, lengths=batch.lengths)
            hooks.run_hooked(model.bridge, batch, fwd, stop_after=hooks.resid(n_layers, n_layers))
    return pd.DataFrame(rows).sort_values(["prompt", "layer", "rank"], ignore_index=True)


def repeated_check(resid: pd.DataFrame) -> pd.DataFrame:
    """Per boundary: the largest |h_t - h_0| over prompts, against the largest |h|."""
    per = resid[resid["rank"] == 1].groupby("layer")
    out = per.agg(max_abs_deviation=("spread", "max"), max_abs_activation=("max_abs", "max"),
                  n_prompts=("prompt", "nunique")).reset_index()
    out["relative_deviation"] = out.max_abs_deviation / out.max_abs_activation
    return out


def repeated_token_property_applies(model: Model) -> str | None:
    """``None`` if every position of a repeated token must be equal, else why not."""
    if model.info.positions != "rotary":
        return (f"{model.info.name} adds learned absolute position embeddings, so the "
                "hidden states of a repeated token differ by design")
    return None


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
        of every evaluated target, ``variant, label, position, nll`` (``position`` is the
        query position ``t``; the target is token ``t + 1``).
    """
    ids = stream_ids(model, cfg)
    frames = []
    for variant, vis in _variants(cfg):
        nll = windowed_losses(model, ids, vis, chunk=cfg.chunk, desc=f"stream {vis.label}")
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


# ---- summaries over prompts -------------------------------------------------------------

CATEGORICAL = tuple(f"top{r}_{w}" for r in TOP_RANKS for w in ("type", "position"))


def sink_rates(per_prompt: pd.DataFrame, cfg: Config) -> pd.DataFrame:
    """Sink_1^eps per input: percentage of heads with alpha_1 > eps, per sequence, averaged."""
    rows = []
    for name, df in per_prompt[per_prompt.metric == "sink"].groupby("input", sort=False):
        per_seq = (df.score > cfg.eps).groupby(df.prompt).mean().to_numpy() * 100
        low, high = bootstrap_mean_ci(per_seq[:, None], n_boot=cfg.n_boot, seed=cfg.seed)
        mean_alpha = df.groupby(["layer", "head"]).score.mean()
        rows.append({"input": name, "eps": cfg.eps, "sink_rate": float(per_seq.mean()),
                     "ci_low": float(low[0]), "ci_high": float(high[0]),
                     "sink_rate_mean_alpha": float((mean_alpha > cfg.eps).mean() * 100),
                     "mean_alpha": float(df.score.mean()),
                     "n_prompts": len(per_seq), "n_heads": len(mean_alpha)})
    return pd.DataFrame(rows)


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


def massive_by_layer(resid: pd.DataFrame) -> pd.DataFrame:
    """Per input and boundary: median over prompts of the top-3 magnitudes and of the median,
    and where the largest activation sits (its most common position and dimension)."""
    rows = []
    for (name, layer), df in resid.groupby(["input", "layer"], sort=False):
        top1 = df[df["rank"] == 1]
        position, dim = top1.position.mode().iloc[0], top1.dim.mode().iloc[0]
        row = {"input": name, "layer": int(layer)}
        for rank in TOP_RANKS:
            row[f"top{rank}"] = float(df[df["rank"] == rank].magnitude.median())
        tokens = top1.token.value_counts(normalize=True) if "token" in top1 else pd.Series()
        row |= {"median_abs": float(top1.median_abs.median()),
                "top1_tokens": ", ".join(f"{t!r} {share:.0%}" for t, share in tokens.items()),
                "ratio": float((top1.magnitude / top1.median_abs).median()),
                "top1_position": int(position),
                "top1_position_share": float((top1.position == position).mean()),
                "top1_dim": int(dim), "top1_dim_share": float((top1.dim == dim).mean()),
                "n_prompts": len(top1)}
        rows.append(row)
    return pd.DataFrame(rows)


def relate_to_sink(massive: pd.DataFrame, scores: pd.DataFrame, eps: float) -> pd.DataFrame:
    """Add ``sink_head_share``: the share of layer l's heads whose mean alpha_1 exceeds
    ``eps``, next to boundary l (the residual stream that layer l reads)."""
    sink = scores[scores.metric == "sink"]
    share = (sink.score > eps).groupby([sink.input, sink.layer]).mean()
    share = share.rename("sink_head_share").reset_index()
    return massive.merge(share, on=["input", "layer"], how="left")


def sink_massive_correlation(massive: pd.DataFrame, input_name: str) -> float:
    """Pearson correlation over layers of log10(top1 / median) and the share of sink heads."""
    df = massive[(massive.input == input_name) & massive.sink_head_share.notna()]
    if len(df) < 3 or df.sink_head_share.nunique() < 2:
        return float("nan")
    return float(np.corrcoef(np.log10(df.ratio), df.sink_head_share)[0, 1])


# ---- the experiment ---------------------------------------------------------------------

@dataclass
class Result:
    """Everything measured; see the module docstring for each table's definitions."""

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

    def tables(self) -> dict[str, pd.DataFrame]:
        natural = self.input_scores[self.input_scores.input == "natural"]
        out = {"head_scores": natural.drop(columns="input").reset_index(drop=True),
               "input_scores": self.input_scores, "sink_rates": self.rates,
               "top_receivers": self.receivers, "sink_per_prompt": self.sink_per_prompt,
               "massive_activations": self.massive,
               "massive_activations_detail": self.massive_detail}
        if self.repeated is not None:
            out["repeated_token_check"] = self.repeated
        if self.streaming is not None and self.stream_losses is not None:
            out["streaming_perplexity"] = self.streaming
            out["streaming_losses"] = self.stream_losses
        return out

    def summary(self) -> list[str]:
        lines = [_rates_line(self.rates, self.cfg)]
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
        return lines


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
        first_without = _mean_share(scores, f"{kind}_no_bos", "sink")
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
    is_massive = natural[(natural.top1 > 100) & (natural.ratio > 1000)]
    text = (f"massive activations (natural text): largest |h| / median |h| = {peak.ratio:.0f} "
            f"(|h| = {peak.top1:.3g}) at boundary {int(peak.layer)}, dim {int(peak.top1_dim)} "
            f"({peak.top1_dim_share:.0%} of sequences), on tokens {peak.top1_tokens}; ")
    if is_massive.empty:
        text += "no boundary has an activation > 100 and > 1000x the median"
    else:
        first = int(is_massive.layer.min())
        share = natural.set_index("layer").sink_head_share
        before = share[share.index < first].mean() if first > 0 else float("nan")
        text += (f"massive (> 100 and > 1000x median) from boundary {first} on; share of sink "
                 f"heads (mean alpha_1 > {cfg.eps:g}) in the layers before: {before:.0%}, "
                 f"from there on: {share[share.index >= first].mean():.0%}")
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


def _scan_inputs(model: Model, sets: dict[str, list[Prompt]], cfg: Config
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-prompt head metrics and residual-stream extremes of every input set."""
    typer = TokenTyper.for_model(model)
    metrics = sink_reductions(typer, model_token_types(model))
    per_prompt, resid = [], []
    for name, prompts in progress.track(list(sets.items()), desc="inputs"):
        log.info("scanning %s (%d prompts)", name, len(prompts))
        scored = reductions.reduce_patterns(model, prompts, metrics,
                                            max_batch_tokens=cfg.max_batch_tokens, desc=name)
        per_prompt.append(scored.assign(input=name))
        extremes = scan_residuals(model, prompts[: cfg.n_massive_prompts],
                                  max_batch_tokens=cfg.max_batch_tokens)
        resid.append(_with_token_types(model, typer, extremes, prompts).assign(input=name))
    return pd.concat(per_prompt, ignore_index=True), pd.concat(resid, ignore_index=True)


def _with_token_types(model: Model, typer: TokenTyper, resid: pd.DataFrame,
                      prompts: Sequence[Prompt]) -> pd.DataFrame:
    """Add the token (string and type) at each activation's position."""
    ids = {i: model.encode(prompts[i])[0] for i in resid.prompt.unique()}
    codes = {i: typer.codes(torch.tensor([row]), torch.ones(1, len(row), dtype=torch.bool))[0]
             for i, row in ids.items()}
    tokens = [model.str_tokens([ids[p][t]])[0] for p, t in zip(resid.prompt, resid.position,
                                                                strict=True)]
    kinds = [TOKEN_TYPES[int(codes[p][t])] for p, t in zip(resid.prompt, resid.position,
                                                           strict=True)]
    return resid.assign(token=tokens, token_type=kinds)


def _skips(model: Model, cfg: Config) -> dict[str, str]:
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
    if (why := repeated_token_property_applies(model)) is not None:
        skipped["repeated"] = why
    return skipped


@experiment("attention-sinks", config=Config, tables=None, demo={
    "n_prompts": 32, "n_massive_prompts": 8, "stream_tokens": 2048, "recompute_stride": 32,
    "n_boot": 200})
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Sink scores, sink rates, massive activations and streaming perplexity (see above)."""
    skipped = _skips(model, cfg)
    sets = input_sets(model, cfg)
    per_prompt, resid = _scan_inputs(model, sets, cfg)
    repeated = None
    if "repeated" not in skipped:
        name = "repeated_no_bos" if "repeated_no_bos" in sets else "repeated"
        if model.info.causal and model.info.bos_token_id is not None and name == "repeated":
            skipped["repeated"] = "compare_bos=false, so no input is one repeated token alone"
        else:
            repeated = repeated_check(resid[resid.input == name])
    streaming = stream_losses = None
    if "streaming" not in skipped:
        streaming, stream_losses = measure_streaming(model, cfg)
    input_scores = summarize_inputs(per_prompt, cfg)
    return Result(
        model=model.info.name, causal=model.info.causal, cfg=cfg,
        input_scores=input_scores, rates=sink_rates(per_prompt, cfg),
        receivers=top_receivers(per_prompt),
        sink_per_prompt=per_prompt[per_prompt.metric == "sink"].reset_index(drop=True),
        massive=relate_to_sink(massive_by_layer(resid), input_scores, cfg.eps),
        massive_detail=resid, repeated=repeated,
        streaming=streaming, stream_losses=stream_losses, skipped=skipped)


# ---- claim checks (data/claims/attention_sinks.json) --------------------------------------

def _rate_row(run: Run, input_name: str) -> pd.Series:
    rates = run.table("sink_rates")
    row = rates[rates.input == input_name]
    if row.empty:
        raise WorkbenchError(f"run {run.id} has no sink rate for input '{input_name}'")
    return row.iloc[0]


def _rate_text(row: pd.Series) -> str:
    return (f"Sink_1^{row.eps:g} on {row.input} = {row.sink_rate:.1f}% "
            f"[{row.ci_low:.1f}, {row.ci_high:.1f}] of {int(row.n_heads)} heads")


@claim_check("sink_rate_at_least")
def sink_rate_at_least(run: Run, *, input: str, threshold: float) -> Measurement:
    """The sink rate on ``input`` is at least ``threshold`` percent."""
    row = _rate_row(run, input)
    return Measurement(f"{_rate_text(row)} (at least {threshold}% needed)",
                       bool(row.sink_rate >= threshold), float(row.sink_rate))


@claim_check("sink_rate_at_most")
def sink_rate_at_most(run: Run, *, input: str, threshold: float) -> Measurement:
    """The sink rate on ``input`` is at most ``threshold`` percent."""
    row = _rate_row(run, input)
    return Measurement(f"{_rate_text(row)} (at most {threshold}% needed)",
                       bool(row.sink_rate <= threshold), float(row.sink_rate))


@claim_check("repeated_states_identical")
def repeated_states_identical(run: Run, *, tolerance: float) -> Measurement:
    """Every position of a repeated-token sequence has the same hidden state, up to
    ``tolerance`` relative to the largest activation."""
    if "repeated_token_check" not in run.table_names():
        raise WorkbenchError(f"run {run.id} has no repeated-token check (see its summary)")
    table = run.table("repeated_token_check")
    worst = table.loc[table.relative_deviation.idxmax()]
    return Measurement(
        f"max_t |h_t - h_0| = {worst.max_abs_deviation:.3g} at boundary {int(worst.layer)}, "
        f"{worst.relative_deviation:.2g} of max |h| (tolerance {tolerance:g})",
        bool(worst.relative_deviation <= tolerance), float(worst.relative_deviation))


def _stream_row(run: Run, spec: str) -> pd.Series:
    """``dense``, ``window``, ``recompute`` or ``sinks:K`` (the K + (W - K) variant)."""
    table = run.table("streaming_perplexity") if "streaming_perplexity" in run.table_names() \
        else None
    if table is None:
        raise WorkbenchError(f"run {run.id} has no streaming perplexity (see its summary)")
    variant, _, k = spec.partition(":")
    picked = table[table.variant == ("sinks+window" if variant == "sinks" else variant)]
    if k:
        picked = picked[picked.n_sinks == int(k)]
    if len(picked) != 1:
        raise WorkbenchError(f"run {run.id} has no streaming variant '{spec}'")
    return picked.iloc[0]


@claim_check("streaming_ratio")
def streaming_ratio(run: Run, *, numerator: str, denominator: str,
                    at_least: float | None = None, at_most: float | None = None
                    ) -> Measurement:
    """Perplexity of ``numerator`` over that of ``denominator`` (on the positions where the
    recompute reference is evaluated) lies within the given bounds."""
    top, bottom = _stream_row(run, numerator), _stream_row(run, denominator)
    ratio = top.ppl_matched / bottom.ppl_matched
    passed = (at_least is None or ratio >= at_least) and (at_most is None or ratio <= at_most)
    bounds = " and ".join(b for b in (f">= {at_least}" if at_least is not None else "",
                                      f"<= {at_most}" if at_most is not None else "") if b)
    return Measurement(
        f"ppl {top.label} {top.ppl_matched:.2f} / {bottom.label} {bottom.ppl_matched:.2f} = "
        f"{ratio:.3g} (needed {bounds}; {int(top.n_matched)} positions of "
        f"{int(top.n_tokens)}-token text)", bool(passed), float(ratio))


def _at_start_or_delimiter(detail: pd.DataFrame) -> pd.Series:
    """Per top-1 row: at position 0, or on a newline or punctuation token (Sun et al.)."""
    delimiter = [("\n" in t) or _is_punctuation(t) for t in detail.token]
    return (detail.position == 0) | pd.Series(delimiter, index=detail.index)


@claim_check("massive_at_start_or_delimiter")
def massive_at_start_or_delimiter(run: Run, *, min_magnitude: float, min_ratio: float,
                                  min_fraction: float) -> Measurement:
    """At some boundary, the largest activation on natural text exceeds ``min_magnitude``
    and ``min_ratio`` x the median (medians over sequences), and in ``min_fraction`` of the
    sequences it sits at the first token or on a delimiter (newline or punctuation)."""
    detail = run.table("massive_activations_detail")
    top1 = detail[(detail.input == "natural") & (detail["rank"] == 1)].copy()
    top1["ratio"] = top1.magnitude / top1.median_abs
    top1["placed"] = _at_start_or_delimiter(top1)
    per_layer = top1.groupby("layer").agg(magnitude=("magnitude", "median"),
                                          ratio=("ratio", "median"), placed=("placed", "mean"),
                                          at_start=("position", lambda p: (p == 0).mean()))
    hits = per_layer[(per_layer.magnitude > min_magnitude) & (per_layer.ratio >= min_ratio)
                     & (per_layer.placed >= min_fraction)]
    peak = per_layer.loc[per_layer.ratio.idxmax()]
    where = (f"boundaries {int(hits.index.min())}..{int(hits.index.max())} qualify"
             if len(hits) else "no boundary qualifies")
    return Measurement(
        f"{where}; peak |h| {peak.magnitude:.3g} = {peak.ratio:.0f}x median at boundary "
        f"{int(per_layer.ratio.idxmax())}, at position 0 in {peak.at_start:.0%} and at the "
        f"first token or a delimiter in {peak.placed:.0%} of sequences",
        bool(len(hits)), float(peak.ratio))


@claim_check("layer_share_at_least")
def layer_share_at_least(run: Run, *, token_type: str, threshold: float) -> Measurement:
    """In some layer, heads give ``token_type`` tokens at least ``threshold`` of their
    attention on average (natural input)."""
    scores = run.table("head_scores")
    share = scores[scores.metric == f"share_{token_type}"]
    if share.empty:
        raise WorkbenchError(f"run {run.id} has no '{token_type}' shares")
    by_layer = share.groupby("layer").score.mean()
    best = int(by_layer.idxmax())
    return Measurement(
        f"largest head-mean {token_type} share {by_layer[best]:.3f} in layer {best} "
        f"(by layer: {', '.join(f'{v:.2f}' for v in by_layer)}; threshold {threshold})",
        bool(by_layer[best] >= threshold), float(by_layer[best]))


if __name__ == "__main__":
    import sys

    from workbench.cli import main

    main(["run", "attention-sinks", *sys.argv[1:]])
