"""Record the residual stream and every attention pattern to disk: :func:`record` writes a
recording, which :class:`~workbench.recording.reader.Recording` reads back lazily.

:func:`record` hooks the bridge so that each layer's attention patterns and residual stream
are written to a chunked Zarr v3 store (:mod:`workbench.recording.zarr_store`) as soon as the
forward pass produces them, one block of query rows at a time; nothing accumulates in
memory, so peak memory does not grow with the number of layers or prompts. With blocked
attention (the default where the family has it, :mod:`workbench.models.blocked`) the model
itself computes each layer's pattern one block of rows at a time, so no ``[head, query,
key]`` array exists at all and memory grows linearly with the prompt's length.

Patterns are stored ``dense``, as ``topk`` (:mod:`workbench.recording.sparse`: the k
largest weights of each row and their keys, plus the exact weights on the first token,
the diagonal and the previous token, and the mass left out), or not at all (``none``).
``auto`` (the default) is dense when the longest prompt has at most
:data:`DENSE_UP_TO` tokens and topk above: a dense 8,192-token smollm2 prompt would take
36 GB.

Dense patterns and residuals are stored as float16 unless a value would overflow it
(smollm2's residual stream reaches about 2.5e4 at the first token, near float16's limit
of 65504): such an array is kept in float32, so nothing is ever silently clipped to
infinity.

Examples:
    >>> rec = record(model, prompts, "data/recordings/example")   # doctest: +SKIP
    >>> rec.patterns, len(rec)                                     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_args

import numpy as np
import torch
import zarr

from workbench.core import attention as run_attention
from workbench.core import durable, progress
from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.core.options import AttentionPath, Dtype, PatternStorage, StoreDtype
from workbench.inputs.batching import Batch, make_batches
from workbench.inputs.prompts import Prompt
from workbench.models import blocked
from workbench.models.base import Model
from workbench.models.blocked import PatternBlock, ScoreInputs
from workbench.recording import hooks, sparse, zarr_store
from workbench.recording.index import FORMAT, INDEX, QKFacts, RecordingIndex
from workbench.recording.qk import STORED_AS, Mask, QKLayer
from workbench.recording.reader import Recording
from workbench.recording.sparse import DEFAULT_TOPK

FLOAT16_MAX = float(np.finfo(np.float16).max)
DENSE_UP_TO = 1024
"""``auto`` stores patterns dense up to this many tokens (the longest prompt), topk above."""


def _storable(block: torch.Tensor, dtype: StoreDtype | Dtype) -> np.ndarray:
    """The block rounded to ``dtype`` (to nearest) as a numpy array (bfloat16 as its bit
    patterns, :data:`~workbench.recording.qk.STORED_AS`), or float32 when float16 would
    overflow."""
    if dtype == "bfloat16":
        return block.detach().to(torch.bfloat16).view(torch.int16).numpy()
    block = block.detach().float()
    if dtype == "float16" and float(block.abs().max()) <= FLOAT16_MAX:
        return block.half().numpy()
    return block.numpy()


def storage_for(patterns: PatternStorage, longest: int) -> PatternStorage:
    """The storage ``patterns`` means for prompts of at most ``longest`` tokens (``auto``
    resolved: dense up to :data:`DENSE_UP_TO` tokens, topk above).

    Raises:
        WorkbenchError: ``patterns`` is not one of :data:`PatternStorage`.
    """
    if patterns not in get_args(PatternStorage):
        raise WorkbenchError(f"patterns must be one of {', '.join(get_args(PatternStorage))}, "
                             f"got {patterns!r}")
    if patterns == "auto":
        return "dense" if longest <= DENSE_UP_TO else "topk"
    return patterns


MASK_CHECK_ROWS = 64
"""Rows at each end of a prompt whose visible keys are compared with the pass's own mask."""


def _check_mask(inputs: ScoreInputs, mask: Mask, row: int, n: int) -> None:
    """Refuse a layer whose mask, for one prompt's first and last rows, is not what
    ``mask`` describes (the qk format could not rebuild its weights)."""
    for r0, r1 in {(0, min(n, MASK_CHECK_ROWS)), (max(0, n - MASK_CHECK_ROWS), n)}:
        seen = inputs.visible(r0, r1)
        theirs = torch.ones(r1 - r0, n, dtype=torch.bool) if seen is None else \
            seen[row if seen.shape[0] > 1 else 0, 0, :, :n].bool()
        mine = mask.visible(slice(r0, r1), slice(0, n), n)
        mine = torch.ones(r1 - r0, n, dtype=torch.bool) if mine is None else mine
        if not torch.equal(theirs, mine):
            raise WorkbenchError(f"layer {inputs.layer}: the model's attention mask is not the "
                                 f"{'causal' if mask.causal else 'bidirectional'} mask "
                                 f"(window {mask.window}) the qk format describes")


class _Writer:
    """Hook functions that write each prompt's slice of a layer's tensors to the group."""

    def __init__(self, group: zarr.Group, shape: dict[str, int], storage: PatternStorage,
                 store_dtype: StoreDtype, topk: int, include_resid: bool,
                 qk_dtype: Dtype = "float32") -> None:
        self.group, self.storage, self.k = group, storage, topk
        self.store_dtype: StoreDtype = store_dtype
        self.qk_dtype: Dtype = qk_dtype
        p, h, t, d = shape["prompts"], shape["heads"], shape["longest"], shape["d_model"]
        self.t_max = t
        self.arrays: dict[tuple[str, int], zarr.Array] = {}
        for layer in range(shape["layers"]):
            if storage == "dense":
                self._add("attn", layer, (p, h, t, t), store_dtype)
            elif storage == "topk":
                self._add("topk_weights", layer, (p, h, t, topk), "float32")
                self._add("topk_keys", layer, (p, h, t, topk), sparse.key_dtype(t))
                self._add("exact", layer, (p, h, t, len(sparse.CHANNELS)), "float32")
            elif storage == "qk":
                self._add("q", layer, (p, h, t, shape["d_head"]), STORED_AS[qk_dtype])
                self._add("k", layer, (p, shape["kv_heads"], t, shape["d_head"]),
                          STORED_AS[qk_dtype])
                self._add("lse", layer, (p, h, t), "float32")
                self._add("first", layer, (p, h, t), "float32")
                self._add("received", layer, (p, h, t), "float32")
        if include_resid:
            for b in range(shape["layers"] + 1):
                self._add("resid", b, (p, t, d), store_dtype)
        self.batch: Batch | None = None
        self._pending: dict[tuple[int, int], list[tuple[int, int, Any]]] = {}
        self.masks: list[Mask] = []
        self._layer_qk: dict[int, QKLayer] = {}
        self._received: dict[int, torch.Tensor] = {}  # each key's received attention, summed
        self.facts: dict[str, list[Any]] = {"scale": [None] * shape["layers"],
                                            "softcap": [None] * shape["layers"],
                                            "alibi": [None] * shape["layers"]}

    def _add(self, kind: str, layer: int, shape: tuple[int, ...], dtype: Any) -> None:
        self.arrays[(kind, layer)] = zarr_store.create(self.group, kind, layer, shape, dtype)

    def hook_fns(self, n_layers: int, advance: Callable[[int], None] | None = None
                 ) -> list[tuple[str, Any]]:
        """The residual stream's hooks (patterns come block by block: :meth:`consume`);
        with ``advance``, each layer's output counts the batch's query rows done."""
        if ("resid", 0) not in self.arrays:
            return []
        return [(hooks.resid(b, n_layers), self._resid_hook(b, advance if b else None))
                for b in range(n_layers + 1)]

    def last_hook(self, n_layers: int) -> str:
        """The last hook point whose tensor is written; the forward pass stops there."""
        if ("resid", 0) in self.arrays:
            return hooks.resid(n_layers, n_layers)
        return hooks.after(n_layers - 1, n_layers)

    def _rows(self):
        assert self.batch is not None
        return enumerate(zip(self.batch.indices, self.batch.lengths, strict=True))

    def consume(self, block: PatternBlock) -> None:
        """Take one block of query rows of a layer: each prompt's real rows, cut at the
        chunks of :data:`zarr_store.QUERY_BLOCK` rows, each chunk written once it is whole."""
        step = zarr_store.QUERY_BLOCK
        for row, (index, n) in self._rows():
            stop = min(block.q1, n)
            if block.q0 >= stop:
                continue
            # a real row sees only real keys, so the block's keys start before n
            rows = block.weights[row, :, : stop - block.q0, : min(block.k1, n) - block.k0]
            start = block.q0
            while start < stop:
                end = min(stop, (start // step + 1) * step)
                part = rows[:, start - block.q0:end - block.q0]
                self._pending.setdefault((block.layer, index), []).append(
                    (start, block.k0, self._sparse(part, start, block.k0)))
                if end == n or end % step == 0:
                    self._flush(block.layer, index)
                start = end

    def _sparse(self, rows: torch.Tensor, q0: int, k0: int) -> Any:
        """What a chunk keeps of some rows: their weights (dense), or their sparse form."""
        if self.storage == "dense":
            return rows.detach().float().numpy()  # weights never overflow float16
        return sparse.topk_rows(rows, q0=q0, k=self.k, k0=k0, n_keys=self.t_max)

    def _flush(self, layer: int, index: int) -> None:
        """Write one chunk of query rows (padded to the chunk, so no chunk is rewritten)."""
        parts = self._pending.pop((layer, index))
        c0 = parts[0][0]
        stop = min(c0 + zarr_store.QUERY_BLOCK, self.t_max)
        if self.storage == "dense":
            first = parts[0][2]
            block = np.zeros((first.shape[0], stop - c0, self.t_max), dtype=self.store_dtype)
            for start, k0, rows in parts:
                block[:, start - c0:start - c0 + rows.shape[1], k0:k0 + rows.shape[2]] = rows
            self.arrays[("attn", layer)][index, :, c0:stop] = block
            return
        for kind, key in (("topk_weights", "weights"), ("exact", "exact"), ("topk_keys", "keys")):
            array = self.arrays[(kind, layer)]
            part = np.concatenate([p[2][key] for p in parts], axis=1)
            block = np.full((part.shape[0], stop - c0, array.shape[-1]), array.fill_value,
                            dtype=array.dtype)
            block[:, : part.shape[1]] = part
            array[index, :, c0:stop] = block

    def take_scores(self, inputs: ScoreInputs) -> None:
        """Write one layer's queries and keys for each prompt of the batch (its own
        tokens, in the recording's ``qk_dtype``), once the layer's :class:`Mask` is checked
        against the pass's own; each row's log-sum-exp follows from the layer's blocks
        (:meth:`take_lse`), from the pass's own queries and keys, never the rounded ones."""
        layer_facts = (inputs.scale, inputs.softcap,
                       None if inputs.slopes is None else inputs.slopes.tolist())
        stored = tuple(self.facts[key][inputs.layer] for key in ("scale", "softcap", "alibi"))
        if stored[0] is not None and stored != layer_facts:
            raise WorkbenchError(f"layer {inputs.layer}'s scale, soft-cap or ALiBi slopes "
                                 "changed between batches; the qk format stores one per layer")
        for key, value in zip(("scale", "softcap", "alibi"), layer_facts, strict=True):
            self.facts[key][inputs.layer] = value
        mask = self.masks[inputs.layer]
        self._layer_qk, self._received = {}, {}
        for row, (index, n) in self._rows():
            _check_mask(inputs, mask, row, n)
            q, k = inputs.queries[row, :, :n], inputs.keys[row, :, :n]
            self._layer_qk[row] = QKLayer(q.float(), k.float(), torch.empty(q.shape[:2]),
                                          inputs.scale, inputs.softcap, mask, inputs.slopes)
            self._received[row] = torch.zeros(q.shape[:2], dtype=torch.float64)
            self._write_tokens("q", inputs.layer, index, _storable(q, self.qk_dtype))
            self._write_tokens("k", inputs.layer, index, _storable(k, self.qk_dtype))

    def take_lse(self, block: PatternBlock) -> None:
        """Each real row's log-sum-exp from the pass's own weights: at the row's largest
        weight ``w`` on key ``j``, ``lse = s_ij - log w`` with ``s_ij`` the score of the
        stored query and key (one dot product a row, where computing the sum anew would
        take the pass's whole ``T x T`` work again), and the attention each key receives,
        the column sums of the same weights (where they are not float32, of ``exp(s -
        lse)`` over the scores computed for the log-sum-exp); a prompt's rows and columns
        are written when its last block is in."""
        for row, (index, n) in self._rows():
            stop = min(block.q1, n)
            if block.q0 >= stop:
                continue
            layer = self._layer_qk[row]
            weights = block.weights[row, :, : stop - block.q0, : min(block.k1, n) - block.k0]
            received = self._received[row]
            if weights.dtype != torch.float32:  # a weight's log would be as coarse as it
                scores = layer.scores(slice(None), slice(block.q0, stop))
                lse = torch.logsumexp(scores, -1)
                layer.lse[:, block.q0:stop] = lse
                received += scores.sub_(lse[..., None]).exp_().sum(1, dtype=torch.float64)
            else:
                best, at = weights.max(-1)  # [head, rows]
                rows = torch.arange(block.q0, stop)
                layer.lse[:, block.q0:stop] = layer.score_at(rows, at + block.k0) - best.log()
                received[:, block.k0: block.k0 + weights.shape[-1]] += weights.sum(
                    1, dtype=torch.float64)
            if stop == n:
                self._write_tokens("lse", block.layer, index, layer.lse.numpy())
                self._write_tokens("received", block.layer, index,
                                   received.to(torch.float32).numpy())
                first = layer.scores(slice(None), slice(0, n), slice(0, 1))[..., 0]
                self._write_tokens("first", block.layer, index,
                                   first.sub_(layer.lse).exp_().numpy())

    def _write_tokens(self, kind: str, layer: int, index: int, values: np.ndarray) -> None:
        """Write one prompt's ``[head, pos, ...]`` values, padded to the longest prompt."""
        array = self.arrays[(kind, layer)]
        if values.dtype == np.float32 and array.dtype == np.float16:
            array = self._widen(kind, layer)
        block = np.zeros(array.shape[1:], dtype=array.dtype)
        block[:, : values.shape[1]] = values
        array[index] = block

    def _resid_hook(self, boundary: int, advance: Callable[[int], None] | None = None):
        def hook(tensor: torch.Tensor, hook: Any) -> None:
            if advance is not None:
                advance(int(tensor.shape[1]))
            for row, (index, n) in self._rows():
                step = zarr_store.RESID_BLOCK
                for p0 in range(0, n, step):
                    part = _storable(tensor[row, p0:min(p0 + step, n)], self.store_dtype)
                    self._write_resid(boundary, index, p0, part)

        return hook

    def _write_resid(self, boundary: int, index: int, p0: int, part: np.ndarray) -> None:
        array = self.arrays[("resid", boundary)]
        if part.dtype == np.float32 and array.dtype == np.float16:
            array = self._widen("resid", boundary)
        stop = min(p0 + zarr_store.RESID_BLOCK, self.t_max)
        block = np.zeros((stop - p0, array.shape[-1]), dtype=array.dtype)
        block[: len(part)] = part
        array[index, p0:stop] = block

    def _widen(self, kind: str, layer: int) -> zarr.Array:
        """Rewrite a float16 array (residuals, queries or keys) as float32 once a block
        would overflow float16 (rare; it costs one read of what that array holds so far)."""
        old = self.arrays[(kind, layer)]
        kept = np.asarray(old[...], dtype=np.float32)
        new = zarr_store.create(self.group, kind, layer, old.shape, "float32", overwrite=True)
        new[...] = kept
        self.arrays[(kind, layer)] = new
        return new


def record(model: Model, prompts: Sequence[Prompt], out: str | Path, *,
           store_dtype: StoreDtype = "float16", max_batch_tokens: int = 2048,
           include_resid: bool = True, patterns: PatternStorage = "auto",
           topk: int = DEFAULT_TOPK, attention: AttentionPath = "auto",
           qk_dtype: Dtype | None = None) -> Recording:
    """Run ``model`` on ``prompts`` and write a recording into folder ``out``.

    Args:
        model: the model to record.
        prompts: texts, sentence pairs or token ids; lengths may differ.
        out: a new or empty folder (a non-empty one is refused, nothing is written).
        store_dtype: ``float16`` (default; an array falls back to float32 if a value
            would overflow) or ``float32``, for dense patterns and residuals.
        max_batch_tokens: prompts are right-padded into batches of at most this many tokens.
        include_resid: also record the residual stream.
        patterns: ``dense``, ``topk``, ``none``, or ``auto`` (dense up to
            :data:`DENSE_UP_TO` tokens, topk above).
        topk: weights kept per query row when patterns are ``topk``.
        attention: how patterns are computed (:data:`~workbench.core.options.AttentionPath`;
            ``auto``: blocked attention where the family has it, so no layer's pattern is
            ever whole and memory grows linearly with the prompt's length).
        qk_dtype: with ``qk`` patterns, the dtype the queries and keys are stored in:
            ``None`` (default), the model's compute dtype, so every weight is exact; a
            lower one rounds them, within the bound of
            :meth:`~workbench.recording.qk.QKLayer.score_error` (the row log-sum-exps are
            float32 and the pass's own either way).

    Returns:
        The recording, opened for reading.

    Raises:
        WorkbenchError: a non-empty ``out``, an empty prompt or one longer than the
            model's context, a bad ``patterns``, ``topk`` or ``qk_dtype``, or nothing to
            record.
    """
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise WorkbenchError(f"{root} is not an empty folder: record into a new or empty one")
    if not prompts:
        raise WorkbenchError("no prompts to record")
    if not isinstance(topk, int) or topk < 1:
        raise WorkbenchError(f"topk must be a positive integer, got {topk!r}")
    qk_dtype = model.info.dtype if qk_dtype is None else qk_dtype
    if qk_dtype not in STORED_AS:
        raise WorkbenchError(f"qk_dtype must be one of {', '.join(STORED_AS)}, got {qk_dtype!r}")
    encoded = [model.encode(p) for p in prompts]
    longest = max(len(ids) for ids, _ in encoded)
    storage = storage_for(patterns, longest)
    if storage == "none" and not include_resid:
        raise WorkbenchError("nothing to record: patterns none and no residual stream")
    if storage == "qk":
        _check_qk(model, attention)
    info = model.info
    shape = {"prompts": len(prompts), "heads": info.n_heads, "longest": longest,
             "d_model": info.d_model, "layers": info.n_layers, "kv_heads": info.n_kv_heads,
             "d_head": info.d_head}
    root.mkdir(parents=True, exist_ok=True)
    group = zarr.open_group(str(root / zarr_store.GROUP), mode="w-")
    writer = _Writer(group, shape, storage, store_dtype, topk, include_resid, qk_dtype)
    writer.masks = [Mask(causal=bool(info.causal), window=info.window(layer))
                    for layer in range(info.n_layers)]
    batches = list(make_batches(encoded, pad_id=model.pad_id, max_tokens=max_batch_tokens,
                                paired=model.paired_batches))  # resample: in twos
    _write(model, writer, batches, storage, attention)
    index = _index(model, prompts, encoded, root, store_dtype=store_dtype, patterns=storage,
                   topk=topk if storage == "topk" else None, resid=include_resid,
                   longest=longest, qk=_qk_facts(model, writer) if storage == "qk" else None)
    # the index is written last: a recording without one does not open
    durable.write_atomic(root / INDEX, index.to_json())
    return Recording.open(root)


def _write(model: Model, writer: _Writer, batches: Sequence[Batch], storage: PatternStorage,
           attention: AttentionPath) -> None:
    """Run every batch through ``model``, stopped after the last tensor ``writer`` keeps,
    with a bar of the query rows done."""
    n_layers = model.info.n_layers
    # the bar counts every layer's query rows, so it moves on one long prompt too
    rows = n_layers * sum(int(b.input_ids.shape[1]) for b in batches)
    with torch.inference_mode(), progress.counting(
            rows, desc="recording (layers x query rows)") as advance, _fed(
            model, writer, storage, attention, advance):
        for batch in batches:
            writer.batch = batch
            hooks.run_hooked(model.bridge, batch,
                             writer.hook_fns(n_layers, None if storage != "none" else advance),
                             stop_after=writer.last_hook(n_layers))


def _check_qk(model: Model, attention: AttentionPath) -> None:
    """Refuse, before anything is written, a ``qk`` recording the model cannot make: its
    queries and keys are taken from the blocked pass, and its scores must be ``scale *
    q . k`` under a causal or bidirectional mask with at most a window."""
    if attention == "dense":
        raise WorkbenchError("qk patterns are taken from the blocked attention path; "
                             "use --attention auto or blocked")
    why = blocked.support(model) or blocked.scores_support(model)
    if why is not None:
        raise ModelCapabilityError(f"{model.info.name}: qk patterns need every layer's scores "
                                   f"as scale * q . k ({why}); record dense or topk patterns")


def _qk_facts(model: Model, writer: _Writer) -> dict[str, Any]:
    info = model.info
    return QKFacts.from_data({
        "kv_heads": info.n_kv_heads, "d_head": info.d_head, "causal": bool(info.causal),
        "scale": writer.facts["scale"], "softcap": writer.facts["softcap"],
        "window": [m.window for m in writer.masks], "dtype": writer.qk_dtype, "first": True,
        "received": True,
        "alibi": writer.facts["alibi"] if any(writer.facts["alibi"]) else None},
        what="the qk facts").to_data()


def _fed(model: Model, writer: _Writer, storage: PatternStorage, attention: AttentionPath,
         advance: Callable[[int], None]) -> contextlib.AbstractContextManager[Any]:
    """Patterns handed to ``writer`` block by block (each block's query rows counted by
    ``advance``), or nothing when patterns are not stored."""
    if storage == "none":
        return contextlib.nullcontext()
    if storage == "qk":
        def take(block: PatternBlock) -> None:
            writer.take_lse(block)
            advance(block.q1 - block.q0)

        run_attention.note("blocked")
        return blocked.blocked(model, take, scores=writer.take_scores)

    def consume(block: PatternBlock) -> None:
        writer.consume(block)
        advance(block.q1 - block.q0)

    return hooks.patterns_fed(model, consume, attention=attention)


def _index(model: Model, prompts: Sequence[Prompt], encoded: list[Any], root: Path,
           **storage: Any) -> RecordingIndex:
    """``index.json`` of a recording just written: the model, the prompts, how patterns
    are stored (``storage``), and the size and SHA-256 of every file of the group."""
    info = model.info
    return RecordingIndex.from_data({
        "format_version": FORMAT, "model": info.to_dict(), "n_layers": info.n_layers,
        "n_heads": info.n_heads, "d_model": info.d_model, **storage,
        "prompts": [
            {"label": p.label, "text": p.text, "pair": p.pair, "token_ids": ids,
             "tokens": model.str_tokens(ids)}
            for p, (ids, _) in zip(prompts, encoded, strict=True)
        ],
        "files": zarr_store.file_manifest(root),
    }, what=str(root / INDEX))
