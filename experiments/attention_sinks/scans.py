"""What attention-sinks scans: its inputs (each kind, with and without its BOS), the parts
that do not apply to a model or config, the per-head reductions of one scan, and the scans
of every input set for head metrics and residual-stream extremes (definitions in the
package docstring)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from experiments.attention_sinks.window_edge import edge_length
from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import Prompt, random_token_ids
from workbench.inputs.sentences import sentence_pairs
from workbench.inputs.token_types import TOKEN_TYPES, TokenTyper, model_token_types
from workbench.models.base import Model
from workbench.recording import reductions
from workbench.recording.residuals import scan_residuals, spread_by_boundary
from workbench.scores import metrics, patterns
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
