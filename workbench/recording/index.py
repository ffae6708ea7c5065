"""The typed ``index.json`` of a recording: the model, the prompts, how patterns are
stored, and every data file with its size and SHA-256.

:class:`RecordingIndex` is the one declaration of both formats a recording may have:
format 2 (the Zarr group, :mod:`workbench.recording.zarr_store`) and format 1 (block
files, read-only, :mod:`workbench.recording.legacy`). The writer builds one and writes
:meth:`~workbench.core.records.Record.to_json`; the reader parses the file with
:meth:`~workbench.core.records.Record.from_json`, so a field of the wrong type or out of
range is refused with its name before any data is read.

Examples:
    >>> index = RecordingIndex.from_json(open("rec/index.json", "rb").read(),
    ...                                  what="rec/index.json")    # doctest: +SKIP
    >>> index.patterns, index.longest, index.prompts[0].tokens[:3]  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from workbench.core.options import Dtype, StoreDtype
from workbench.core.records import Count, Hex64, PositiveInt, Record, RelPath
from workbench.store.records import ModelInfo

INDEX = "index.json"
"""The file of a recording folder that holds its :class:`RecordingIndex`."""
LEGACY_FORMAT, FORMAT = 1, 2
BlockDtype = Literal["float16", "float32"]
BLOCK_BYTES = {"float16": 2, "float32": 4}
TokenId = Annotated[int, Field(ge=0, le=1 << 31)]


class FileEntry(Record):
    """A data file of the recording: its size in bytes and SHA-256."""

    size: Count
    sha256: Hex64


class RecordedPrompt(Record):
    """One recorded prompt: its label, text (or sentence pair), token ids and tokens."""

    label: str
    text: str | None
    pair: str | None
    token_ids: Annotated[tuple[TokenId, ...], Field(min_length=1)]
    tokens: tuple[str, ...]

    @model_validator(mode="after")
    def _one_token_per_id(self) -> Self:
        if len(self.tokens) != len(self.token_ids):
            raise ValueError(f"'tokens' has {len(self.tokens)} strings for "
                             f"{len(self.token_ids)} token ids")
        return self


Block = tuple[Count, BlockDtype]
"""A format-1 block: its byte offset in the layer's file and its dtype."""


class QKFacts(Record):
    """How a ``qk`` recording's weights are computed from its queries and keys
    (:class:`workbench.recording.qk.QKLayer`), per layer where it differs."""

    kv_heads: PositiveInt
    d_head: PositiveInt
    causal: bool
    scale: tuple[Annotated[float, Field(gt=0, allow_inf_nan=False)], ...]
    softcap: tuple[Annotated[float, Field(gt=0, allow_inf_nan=False)] | None, ...]
    window: tuple[PositiveInt | None, ...]
    alibi: tuple[tuple[Annotated[float, Field(allow_inf_nan=False)], ...] | None, ...] | None = None
    """Each layer's ALiBi slopes, one per head (``None``: the family has no ALiBi; recordings
    made before ALiBi was stored have none)."""
    dtype: Dtype = "float32"
    """The dtype the queries and keys are stored in (the model's compute dtype unless a
    lower one was asked for; recordings made before it was stored hold float32); the row
    log-sum-exps are always float32."""
    first: bool = False
    """Whether each row's weight on the first key is stored too (``first``, float32, from
    the pass's own queries and keys): a prompt's sink scores read without its queries.
    Recordings made before it was stored have none, and compute it from the queries."""
    received: bool = False
    """Whether the attention each key receives is stored too (``received``, float32: the
    column sums of the pass's own weights): a page's received-attention strip read without
    the queries and keys. Recordings made before it was stored compute it from them."""


class RecordingIndex(Record):
    """A recording's ``index.json`` (format 2, or format 1 with its ``blocks``)."""

    format_version: Literal[1, 2]
    model: ModelInfo
    n_layers: Annotated[int, Field(ge=1, le=1 << 16)]
    n_heads: Annotated[int, Field(ge=1, le=1 << 16)]
    d_model: Annotated[int, Field(ge=1, le=1 << 20)]
    store_dtype: StoreDtype
    prompts: Annotated[tuple[RecordedPrompt, ...], Field(min_length=1)]
    files: dict[RelPath, FileEntry]
    patterns: Literal["dense", "topk", "qk", "none"] = "dense"
    """How patterns are stored (format 1: always dense)."""
    qk: QKFacts | None = None
    """What rebuilds the weights of a ``qk`` recording from its queries and keys."""
    topk: PositiveInt | None = None
    """Weights kept per query row of a ``topk`` recording."""
    resid: bool | None = None
    """Format 2: whether the residual stream is recorded (format 1 says so by its blocks)."""
    longest: PositiveInt | None = None
    """Format 2: the longest prompt's length, the arrays' token dimension."""
    blocks: dict[str, tuple[Block, ...]] | None = None
    """Format 1: ``{"attn/<layer>" or "resid/<boundary>": one block per prompt}``."""

    @model_validator(mode="after")
    def _format_fields(self) -> Self:
        if self.format_version == LEGACY_FORMAT:
            _check_blocks(self)
            return self
        for key in ("resid", "longest"):
            if getattr(self, key) is None:
                raise ValueError(f"format 2 needs '{key}'")
        if self.patterns == "topk" and self.topk is None:
            raise ValueError("'topk' is not a positive integer")
        if (self.patterns == "qk") != (self.qk is not None):
            raise ValueError("'qk' is given exactly when patterns are qk")
        if self.qk is not None and not (len(self.qk.scale) == len(self.qk.softcap)
                                        == len(self.qk.window) == self.n_layers):
            raise ValueError("'qk' needs a scale, a soft-cap and a window for every layer")
        if self.qk is not None and self.qk.alibi is not None and (
                len(self.qk.alibi) != self.n_layers
                or any(s is not None and len(s) != self.n_heads for s in self.qk.alibi)):
            raise ValueError("'qk.alibi' needs a slope per head for every layer")
        if self.qk is not None and self.n_heads % self.qk.kv_heads:
            raise ValueError("'qk.kv_heads' does not divide the heads")
        if self.longest != max(len(p.token_ids) for p in self.prompts):
            raise ValueError("'longest' is not the length of the longest prompt")
        return self

    @property
    def has_resid(self) -> bool:
        if self.format_version == LEGACY_FORMAT:
            return "resid/0" in (self.blocks or {})
        return bool(self.resid)


def data_file(kind: str, layer: int) -> str:
    """The format-1 data file of layer (or boundary) ``layer`` of ``kind`` (``attn`` or
    ``resid``)."""
    return f"{kind}/{'L' if kind == 'attn' else 'B'}{layer:03d}.bin"


def _check_blocks(index: RecordingIndex) -> None:
    """Format 1: every layer has one block per prompt, inside its listed file."""
    if index.blocks is None:
        raise ValueError("format 1 needs 'blocks'")
    kinds = {"attn": index.n_layers}
    if "resid/0" in index.blocks:
        kinds["resid"] = index.n_layers + 1
    lengths = [len(p.token_ids) for p in index.prompts]
    for kind, n_files in kinds.items():
        for layer in range(n_files):
            rel = data_file(kind, layer)
            entries = index.blocks.get(f"{kind}/{layer}")
            if rel not in index.files:
                raise ValueError(f"data file {rel} is not listed in 'files'")
            if entries is None or len(entries) != len(lengths):
                raise ValueError(f"'blocks' has no {kind}/{layer} entry for each prompt")
            for n, (offset, dtype) in zip(lengths, entries, strict=True):
                size = index.n_heads * n * n if kind == "attn" else n * index.d_model
                if offset + size * BLOCK_BYTES[dtype] > index.files[rel].size:
                    raise ValueError(f"a block of {kind}/{layer} lies beyond the end of {rel}")


RECORDS: dict[str, type[Record]] = {"recording-index": RecordingIndex}
"""The recording's record types by schema name."""
