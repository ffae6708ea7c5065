"""Per-head statistics of attention patterns, computed while the forward pass runs.

A *pattern reduction* maps one layer's attention weights ``[batch, head_index, query_pos,
key_pos]`` to one number per prompt and head. :func:`reduce_patterns` runs the model and
hands the reductions each layer's weights one block of query rows at a time
(:func:`workbench.recording.hooks.patterns_fed`: with blocked attention no layer's pattern
is ever whole, :mod:`workbench.models.blocked`), keeping only each block's share of every
score, so no pattern and no activation cache outlives the block that made it.

A reduction is block-wise (:class:`BlockReduction`): ``part(block, ctx)`` is the block's
share of the score, a :class:`Partial` such as the sum and count of a mean over queries
(:class:`QueryMean`), and the shares of a layer's blocks add up to exactly the score of
the whole pattern (a mean is divided once, at the end). Called on a whole pattern a
reduction returns its score. :class:`PatternContext` says which rows and keys a block
holds (``q0 .. q1``, from ``k0``); every weight outside its keys is zero.

Padding is handled here once: batches are right-padded, and a reduction receives a
:class:`PatternContext` whose ``query_mask`` marks the real queries; padded keys already
carry zero weight for every real query (causal models never look ahead, and padded keys
are masked out of encoders).

Examples:
    >>> per_prompt = reduce_patterns(model, prompts, {"entropy": entropy})  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Self

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from workbench.core import attention as attention_notes
from workbench.core import progress
from workbench.core.options import AttentionPath
from workbench.inputs.batching import Batch
from workbench.inputs.prompts import Prompt
from workbench.models.base import Model
from workbench.models.blocked import PatternBlock
from workbench.models.blocked import PatternConsumer as PatternBlockConsumer
from workbench.models.fused import Statistics
from workbench.recording import hooks

if TYPE_CHECKING:  # fused_scan imports this module's types: imported where it runs
    from workbench.recording.fused_scan import FusedScan


@dataclass
class PatternContext:
    """What a reduction may need besides the pattern: the batch, and which part of each
    layer's pattern it is handed (query rows ``q0 .. q1``, keys from ``k0``; a whole
    pattern has ``q0 = k0 = 0`` and ``q1 = None``, every row)."""

    input_ids: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    query_mask: Bool[Tensor, "batch pos"]
    layer: int
    causal: bool
    q0: int = 0
    q1: int | None = None
    k0: int = 0
    _shared: dict[str, tuple[Tensor, Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def shared(self, name: str, pattern: Tensor, compute: Callable[[Tensor], Tensor]
               ) -> Tensor:
        """``compute(pattern)``, computed once for this context and this very pattern
        tensor: several reductions of one block read the same per-row quantity (entropy
        and normalized entropy, the row's entropy), and each block has its own context."""
        hit = self._shared.get(name)
        if hit is not None and hit[0] is pattern:
            return hit[1]
        value = compute(pattern)
        self._shared[name] = (pattern, value)  # the pattern is held, so its id is not reused
        return value

    @property
    def n_pos(self) -> int:
        """The positions of the batch (its padded width): every key of a layer."""
        return int(self.input_ids.shape[1])

    @property
    def queries(self) -> Int[Tensor, " query_pos"]:
        """The positions of the query rows the reduction is handed."""
        return torch.arange(self.q0, self.n_pos if self.q1 is None else self.q1)

    @property
    def real_queries(self) -> Bool[Tensor, "batch query_pos"]:
        """Which of those rows are real tokens (not padding)."""
        return self.query_mask[:, self.q0:self.q1]

    def keys(self, n_keys: int) -> Int[Tensor, " key_pos"]:
        """The positions of a block's ``n_keys`` key columns."""
        return torch.arange(self.k0, self.k0 + n_keys)

    def block(self, block: PatternBlock) -> PatternContext:
        """This context for one block of a layer."""
        return dataclasses.replace(self, layer=block.layer, q0=block.q0, q1=block.q1,
                                   k0=block.k0)


class Partial(Protocol):
    """A block's share of a score: shares add (``+``), and ``result()`` is the score."""

    def __add__(self, other: Self) -> Self: ...

    def result(self) -> Float[Tensor, "batch head_index"]: ...


@dataclass(frozen=True)
class QueryMean:
    """A mean over query rows in parts: the total of the counted rows' values and how many
    rows were counted, so blocks add exactly and the mean is taken once."""

    total: Float[Tensor, "batch head_index"]
    count: Float[Tensor, "batch 1"]  # one count per prompt, the same for every head

    @classmethod
    def of(cls, values: Float[Tensor, "batch head_index query_pos"],
           counted: Bool[Tensor, "batch query_pos"]) -> QueryMean:
        """The share of ``values`` at the ``counted`` rows (float32 sums)."""
        weight = counted[:, None, :].to(device=values.device, dtype=torch.float32)
        return cls((values.float() * weight).sum(-1), weight.sum(-1))

    def __add__(self, other: QueryMean) -> QueryMean:
        return QueryMean(self.total + other.total, self.count + other.count)

    def result(self) -> Float[Tensor, "batch head_index"]:
        """The mean, NaN for a prompt with no counted row."""
        count = self.count.where(self.count > 0, torch.full_like(self.count, float("nan")))
        return self.total / count


@dataclass(frozen=True)
class Total:
    """A score that is a sum over query rows (already divided by whatever it is a share
    of): blocks add, and the sum is the score."""

    value: Float[Tensor, "batch head_index"]

    def __add__(self, other: Total) -> Total:
        return Total(self.value + other.value)

    def result(self) -> Float[Tensor, "batch head_index"]:
        return self.value


@dataclass(frozen=True)
class KeyTotals:
    """Per-key sums over query rows (the weight each key receives), turned into the score
    by ``finish`` once every block is in (a ranking of keys needs all of them)."""

    totals: Float[Tensor, "batch head_index key_pos"]
    finish: Callable[[Tensor], Tensor]

    def __add__(self, other: KeyTotals) -> KeyTotals:
        return KeyTotals(self.totals + other.totals, self.finish)

    def result(self) -> Float[Tensor, "batch head_index"]:
        return self.finish(self.totals)


@dataclass(frozen=True)
class _Whole:
    """The score of a reduction that only reads whole patterns (its one block is all)."""

    value: Float[Tensor, "batch head_index"]

    def __add__(self, other: _Whole) -> _Whole:
        raise TypeError("a reduction of whole patterns has one part per layer")

    def result(self) -> Float[Tensor, "batch head_index"]:
        return self.value


StatisticsPart = Callable[[Statistics, PatternContext], Partial]
"""A layer's :class:`Partial` from its fused :class:`~workbench.models.fused.Statistics`
and the context of its whole rows."""


class BlockReduction:
    """A pattern reduction computed block by block.

    ``part(pattern, ctx)`` is one block's :class:`Partial`; the parts of a layer's blocks
    add up to its score. Called on a whole pattern (``fn(pattern, ctx)``), it returns the
    score ``[batch, head_index]``, as a plain reduction function would.
    """

    def __init__(self, part: Callable[[Tensor, PatternContext], Partial], name: str,
                 doc: str | None = None) -> None:
        self.part = part
        self.__name__ = name
        self.__doc__ = doc
        self.from_statistics: StatisticsPart | None = None
        """The layer's score from the fused kernel's statistics (the whole layer's rows at
        once), where the metric is a function of them; ``None``: it needs the pattern."""

    def reads(self, part: StatisticsPart) -> BlockReduction:
        """Declare how the score is read off the fused kernel's statistics (returns self)."""
        self.from_statistics = part
        return self

    def __call__(self, pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                 ctx: PatternContext) -> Float[Tensor, "batch head_index"]:
        return self.part(pattern, ctx).result()

    def __repr__(self) -> str:
        return f"BlockReduction({self.__name__})"


def query_mean(per_query: Callable[[Tensor, PatternContext],
                                   tuple[Float[Tensor, "batch head_index query_pos"],
                                         Bool[Tensor, "batch query_pos"]]]) -> BlockReduction:
    """The reduction that averages ``per_query``'s values over the rows it counts
    (``per_query(pattern, ctx) -> (values, counted)``), block by block."""

    @functools.wraps(per_query)
    def part(pattern: Tensor, ctx: PatternContext) -> QueryMean:
        return QueryMean.of(*per_query(pattern, ctx))

    return BlockReduction(part, per_query.__name__, per_query.__doc__)


Reduction = BlockReduction | Callable[
    [Float[Tensor, "batch head_index query_pos key_pos"], PatternContext],
    Float[Tensor, "batch head_index"]]
"""A :class:`BlockReduction`, or a plain function of a whole pattern (which makes
:func:`reduce_patterns` take the dense path, one block per layer)."""


def _part(fn: Reduction, pattern: Tensor, ctx: PatternContext) -> Partial:
    if isinstance(fn, BlockReduction):
        return fn.part(pattern, ctx)
    return _Whole(fn(pattern, ctx))


def reduce_patterns(model: Model, prompts: Sequence[Prompt],
                    reductions: Mapping[str, Reduction], *,
                    max_batch_tokens: int = 2048, desc: str = "scoring",
                    layers: Sequence[int] | None = None,
                    attention: AttentionPath = "auto", block: int | None = None,
                    reference: Sequence[Prompt] | None = None) -> pd.DataFrame:
    """Apply pattern reductions to every head of every layer, on the fly.

    Args:
        model: the model.
        prompts: the prompts (any lengths).
        reductions: ``{metric name: reduction}``.
        max_batch_tokens: batch size in tokens.
        layers: only these layers (the pass stops once the deepest one's pattern is
            read: before that layer's MLP); default all.
        attention: how patterns are computed (:data:`~workbench.core.options.AttentionPath`;
            a plain function among ``reductions`` needs whole patterns: ``dense``; ``fused``
            and, on CUDA, ``auto`` read every score off the fused kernel's statistics where
            each reduction declares how: :mod:`workbench.recording.fused_scan`).
        block: query rows per block (default: from the blocked path's memory budget).
        reference: the prompts whose token ids the reductions read, one per prompt and as
            long as it (default: the prompts themselves). A structured null input
            (:mod:`workbench.inputs.nulls`) is scored with its real twin as reference, so
            its pattern is read at the real prompt's targets.

    Returns:
        Long format, one row per (prompt, layer, head, metric): ``prompt, layer, head,
        metric, score``. ``workbench.scores.stats.summarize`` turns it into means with intervals.
    """
    from workbench.recording import fused_scan

    whole = not all(isinstance(fn, BlockReduction) for fn in reductions.values())
    batches = model.batches(prompts, max_tokens=max_batch_tokens)
    layers = sorted(set(range(model.info.n_layers) if layers is None else layers))
    frames: list[pd.DataFrame] = []
    state: dict[str, PatternContext] = {}
    parts: dict[tuple[int, str], Partial] = {}
    read = None if reference is None else _reference_ids(model, prompts, reference)

    def take(layer: int, metric: str, part: Partial) -> None:
        key = (layer, metric)
        parts[key] = part if key not in parts else parts[key] + part

    def consume(block: PatternBlock) -> None:
        ctx = state["ctx"].block(block)
        for metric, fn in reductions.items():
            take(block.layer, metric, _part(fn, block.weights, ctx))
        if block.layer == layers[-1] and block.q0 + block.weights.shape[-2] == block.n_keys:
            hooks.stop_pass()  # the deepest layer's last rows: nothing after them is read

    scan = fused_scan.FusedScan(model, {name: getattr(fn, "from_statistics", None)
                                        for name, fn in reductions.items()},
                                lambda: state["ctx"], take, layers[-1])
    with torch.inference_mode(), _fed(model, consume, scan, "dense" if whole else attention,
                                      layers, max(b.input_ids.shape[1] for b in batches)
                                      if whole else block):
        for batch in progress.track(batches, desc=desc):
            state["ctx"] = PatternContext(
                input_ids=batch.input_ids if read is None else _batch_ids(batch, read),
                lengths=torch.tensor(batch.lengths),
                query_mask=batch.attention_mask.bool(), layer=-1, causal=model.info.causal)
            parts.clear()
            hooks.run_hooked(model.bridge, batch, [],
                             stop_after=hooks.after(layers[-1], model.info.n_layers))
            scores = {key: part.result().detach().float().cpu() for key, part in parts.items()}
            frames.append(_to_frame(scores, batch.indices))
    return pd.concat(frames, ignore_index=True).sort_values(
        ["prompt", "layer", "head", "metric"], ignore_index=True)


@contextlib.contextmanager
def _fed(model: Model, consume: PatternBlockConsumer, scan: FusedScan,
         attention: AttentionPath, layers: Sequence[int], block: int | None
         ) -> Iterator[None]:
    """The scan's pass: on the fused path (:meth:`FusedScan.path`) the blocked pass with
    the kernel's statistics in place of each layer's blocks, else blocks of weights to
    ``consume``; the path taken is noted for the run (:mod:`workbench.core.attention`)."""
    from workbench.models import blocked

    path = scan.path(attention)
    if path == "fused":
        with blocked.blocked(model, consume, layers=set(layers), block=block, fused=scan):
            yield
        attention_notes.note("blocked" if scan.fell_back else "fused")
        return
    # patterns_fed notes its own path
    with hooks.patterns_fed(model, consume, attention="dense" if path == "dense" else "blocked",
                            layers=layers, block=block):
        yield


def _reference_ids(model: Model, prompts: Sequence[Prompt], reference: Sequence[Prompt]
                   ) -> list[list[int]]:
    """The token ids of each reference prompt, checked against its prompt's length."""
    if len(reference) != len(prompts):
        raise ValueError(f"{len(reference)} reference prompts for {len(prompts)} prompts")
    out = []
    for prompt, ref in zip(prompts, reference, strict=True):
        ids, ref_ids = model.encode(prompt)[0], model.encode(ref)[0]
        if len(ids) != len(ref_ids):
            raise ValueError(f"reference {ref.label} has {len(ref_ids)} tokens, its prompt "
                             f"{prompt.label} {len(ids)}")
        out.append(ref_ids)
    return out


def _batch_ids(batch: Batch, read: Sequence[list[int]]) -> Int[Tensor, "batch pos"]:
    """The batch's ids with each real position's replaced by its reference's."""
    ids = batch.input_ids.clone()
    for row, (index, length) in enumerate(zip(batch.indices, batch.lengths, strict=True)):
        ids[row, :length] = torch.tensor(read[index])
    return ids


def uniform_pattern(n: int, causal: bool, rows: tuple[int, int] | None = None,
                    window: int | None = None) -> Float[Tensor, "1 1 query_pos key_pos"]:
    """Attention spread evenly over the keys each query can see: the null pattern (only
    query rows ``rows = (q0, q1)`` of it, if given). ``window``: a causal sliding layer's
    span, the last ``window`` keys, the query's own included (the model's own mask:
    ``0 <= q - k < window``)."""
    q0, q1 = rows if rows is not None else (0, n)
    queries, keys = torch.arange(q0, q1)[:, None], torch.arange(n)[None, :]
    visible = keys <= queries if causal else torch.ones(q1 - q0, n, dtype=torch.bool)
    if window is not None:
        if not causal:
            raise ValueError("a sliding window is read as causal: the last keys before "
                             "each query")
        visible = visible & (queries - keys < window)
    visible = visible.float()
    return (visible / visible.sum(-1, keepdim=True))[None, None]


def null_scores(model: Model, prompts: Sequence[Prompt],
                reductions: Mapping[str, Reduction], *, window: int | None = None
                ) -> pd.DataFrame:
    """Each reduction applied to the uniform pattern of every prompt (no forward pass).

    This is what a score would be for a head that attends evenly to everything it can
    see, so a reader knows what "high" means for that score on those prompts. Block-wise
    reductions get the pattern one block of rows at a time, as in a pass. ``window``: the
    uniform pattern of a sliding layer of that span (:func:`layer_nulls` picks it per
    layer).

    Returns:
        ``prompt, metric, score`` (the same for every head).
    """
    from workbench.models.blocked import rows_per_block

    rows = []
    for i, prompt in enumerate(prompts):
        ids, _ = model.encode(prompt)
        n = len(ids)
        ctx = PatternContext(input_ids=torch.tensor([ids]), lengths=torch.tensor([n]),
                             query_mask=torch.ones(1, n, dtype=torch.bool), layer=-1,
                             causal=model.info.causal)
        for metric, fn in reductions.items():
            step = rows_per_block(1, 1, n) if isinstance(fn, BlockReduction) else n
            total: Partial | None = None
            for q0 in range(0, n, step):
                q1 = min(q0 + step, n)
                pattern = uniform_pattern(n, model.info.causal, (q0, q1), window)
                part = _part(fn, pattern, dataclasses.replace(ctx, q0=q0, q1=q1))
                total = part if total is None else total + part
            assert total is not None
            rows.append((i, metric, float(total.result()[0, 0])))
    return pd.DataFrame(rows, columns=["prompt", "metric", "score"])


def layer_nulls(model: Model, prompts: Sequence[Prompt],
                reductions: Mapping[str, Reduction]) -> pd.DataFrame:
    """:func:`null_scores` for every layer: a global layer's uniform pattern spreads over
    every key its mask allows, a sliding layer's only over its window
    (``model.info.window(layer)``), so beyond the window a sliding layer's null is what
    that layer can do (a first-token null of 0 once the first token is out of reach).
    Each distinct span is computed once.

    Returns:
        ``prompt, layer, metric, score`` (the same for every head of a layer).
    """
    spans = [model.info.window(layer) for layer in range(model.info.n_layers)]
    by_span = {span: null_scores(model, prompts, reductions, window=span)
               for span in dict.fromkeys(spans)}
    return pd.concat([by_span[span].assign(layer=layer) for layer, span in enumerate(spans)],
                     ignore_index=True)[["prompt", "layer", "metric", "score"]]


def _to_frame(batch_out: Mapping[tuple[int, str], Tensor], indices: list[int]) -> pd.DataFrame:
    """One batch's scores in long format, built as one frame from whole columns (a frame per
    layer and metric, concatenated, cost a tenth of a bfloat16 scan of 8 x 128 tokens)."""
    columns: dict[str, list[np.ndarray]] = {name: [] for name in
                                            ("prompt", "layer", "head", "metric", "score")}
    for (layer, metric), scores in batch_out.items():
        n_rows, n_heads = scores.shape
        columns["prompt"].append(np.repeat(indices, n_heads))
        columns["layer"].append(np.full(n_rows * n_heads, layer))
        columns["head"].append(np.tile(np.arange(n_heads), n_rows))
        columns["metric"].append(np.full(n_rows * n_heads, metric, dtype=object))
        columns["score"].append(scores.reshape(-1).numpy())
    return pd.DataFrame({name: np.concatenate(parts) for name, parts in columns.items()})
