"""Read a recording back lazily: :class:`Recording` opens a recording folder (or the run
folder that holds one), checks its ``index.json`` before anything else is read, and reads
only the chunks each call needs. :func:`workbench.recording.writer.record` writes one.
Recordings of format 1 (``index.json`` + ``attn/*.bin``, see
:mod:`workbench.recording.legacy`) still open, read-only.

Examples:
    >>> rec = Recording.open("data/runs/<run-id>")        # doctest: +SKIP
    >>> rec.tokens(0)[:3], rec.pattern(0, layer=3, head=1).shape   # doctest: +SKIP
    >>> rec.pattern_sparse(0, layer=3, head=1).keys[:4]            # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from jaxtyping import Float

from workbench.core import checksums
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.files import read_bounded
from workbench.core.records import RecordError
from workbench.recording import legacy, sparse, zarr_store
from workbench.recording.index import INDEX, LEGACY_FORMAT, RecordedPrompt, RecordingIndex
from workbench.recording.qk import STORED_AS, Mask, QKLayer, from_stored
from workbench.recording.sparse import DEFAULT_TOPK
from workbench.store.records import RunMeta
from workbench.store.validate import confined_file, real

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import zarr

RUN_JSON = "run.json"

MAX_INDEX = 256 << 20
"""An ``index.json`` larger than this is not one (a big recording's is tens of megabytes)."""


def _read_index(root: Path, anchor: str | None = None) -> RecordingIndex:
    """``index.json`` of recording folder ``root``, parsed and checked.

    Args:
        root: the recording folder.
        anchor: the SHA-256 its run's ``run.json`` keeps of this ``index.json`` (``None``
            for a recording outside a run, or of a run written before anchors were kept).

    Raises:
        WorkbenchError: unreadable, not JSON, not the shape of an index, or not the index
            its run recorded.
    """
    where = root / INDEX
    file = confined_file(root, INDEX, what=f"recording {root}")
    data = read_bounded(file, MAX_INDEX, what="recording index")
    if anchor is not None and hashlib.sha256(data).hexdigest() != anchor:
        raise ChecksumError(f"{where} is not the index its run recorded (run.json keeps "
                            "another SHA-256): the recording is damaged")
    try:
        return RecordingIndex.from_json(data, what=str(where))
    except RecordError as exc:
        raise WorkbenchError(f"{exc}: the recording is damaged") from None


def _anchor(run_dir: Path, root: Path) -> str | None:
    """The SHA-256 that ``run_dir``'s ``run.json`` keeps of recording ``root``'s index.

    Raises:
        WorkbenchError: the ``run.json`` is not readable as one (the recording cannot then
            be checked against it).
    """
    try:
        file = confined_file(run_dir, RUN_JSON, what=f"run {run_dir.name}")
        meta = RunMeta.from_json(read_bounded(file, MAX_INDEX, what=RUN_JSON),
                                 what=str(run_dir / RUN_JSON))
    except WorkbenchError as exc:
        raise WorkbenchError(f"the recording's run is damaged: {exc}") from None
    return meta.recordings.get(root.name)


@dataclass(frozen=True)
class Pooled:
    """A window of one head's pattern pooled to screen resolution.

    ``grid[i, j]`` pools queries ``q0 + i*factor ..`` and keys ``k0 + j*factor ..``
    (``factor`` positions a side, ``how`` = max or sum); ``window`` is ``(q0, q1, k0, k1)``.
    """

    grid: Float[np.ndarray, "qcell kcell"]
    factor: int
    how: sparse.Pooling
    window: tuple[int, int, int, int]


Queries = tuple[int, int] | None
"""Query rows ``(start, stop)`` of a read; ``None`` for every row of the prompt."""


QK_LAYERS_KEPT = 4
"""The stored queries and keys of this many (prompt, layer) pairs a ``qk`` recording keeps
read (a page drawing tiles of one head reads its layer once)."""
DENSE_VIEW_BYTES = 2 << 30
"""The largest dense view :meth:`Recording.pattern` builds (float32 weights): 9 heads of an
8,192-token prompt are 2.4 GB; past it the pattern is read a head, a block of rows, pooled
or (``qk``) a tile at a time."""


class Recording:
    """Lazy, read-only access to a recording: each call reads only the chunks it needs.

    ``patterns`` says how patterns were stored (``dense``, ``topk``, ``qk`` or ``none``);
    ``format_version`` is 2 (Zarr) or 1 (the old block files, read-only).
    """

    def __init__(self, root: Path, index: RecordingIndex) -> None:
        self.root = root
        self.index = index
        self.format_version = index.format_version
        self.model = index.model
        self.n_layers, self.n_heads, self.d_model = index.n_layers, index.n_heads, index.d_model
        self.prompts = index.prompts
        self.patterns, self.topk = index.patterns, index.topk
        legacy_format = self.format_version == LEGACY_FORMAT
        self._group = None if legacy_format else zarr_store.open_group(root, index.files)
        self._qk_layers: dict[tuple[int, int], QKLayer] = {}
        self._first_mass: dict[tuple[int, int], np.ndarray] = {}  # qk: computed, not read
        self._received: dict[tuple[int, int, int], np.ndarray] = {}  # qk: the last few

    @classmethod
    def open(cls, path: str | Path) -> Recording:
        """Open a recording folder, or the run folder that holds one.

        ``index.json`` is checked before anything else is read: its shape and types, every
        file it lists being a regular file inside the recording folder (symlinks
        resolved) with the recorded size, and (format 2) every array having the shape the
        index implies, or (format 1) every block lying within its file. A recording folder
        inside a run folder must resolve inside that run folder.

        Raises:
            WorkbenchError: no recording there, or an ``index.json`` that is not one (the
                message names the file and what is wrong).
            ChecksumError: a listed file is missing or has the wrong size (truncated or
                replaced; :meth:`verify` also checks the SHA-256).
        """
        root = Path(path)
        if (root / "recording" / INDEX).is_file():
            root = root / "recording"
        if not (root / INDEX).is_file():
            raise WorkbenchError(f"no recording in {path} (expected {INDEX})")
        # a recording inside a run (recording/, example/) must not be a symlink out of it
        run_dir = root.parent if (root.parent / RUN_JSON).is_file() else root
        if not real(root).is_relative_to(real(run_dir)):
            raise WorkbenchError(f"recording {root} leads outside its run folder {run_dir} "
                                 "(through a symlink)")
        index = _read_index(root, _anchor(run_dir, root) if run_dir != root else None)
        zarr_store.check_files(root, index.files, what=f"{root / INDEX} file")
        rec = cls(root, index)
        if rec._group is not None:
            for kind, count, shape, dtypes in rec._arrays():
                for layer in range(count):
                    zarr_store.check_array(rec._group, kind, layer, shape, dtypes)
        return rec

    def _arrays(self) -> list[tuple[str, int, tuple[int, ...], tuple[str, ...]]]:
        """``(kind, how many layers, shape, dtypes the writer may choose)`` of every array
        the index implies."""
        p, h, t, k = len(self.prompts), self.n_heads, self.index.longest or 0, self.topk or 0
        stored = (self.index.store_dtype, "float32")  # float16 widened if it would overflow
        kinds = {"dense": [("attn", (p, h, t, t), (self.index.store_dtype,))],
                 "topk": [("topk_weights", (p, h, t, k), ("float32",)),
                          ("topk_keys", (p, h, t, k), (str(np.dtype(sparse.key_dtype(t))),)),
                          ("exact", (p, h, t, len(sparse.CHANNELS)), ("float32",))],
                 "qk": self._qk_arrays(),
                 "none": []}[self.patterns]
        out = [(kind, self.n_layers, shape, dtypes) for kind, shape, dtypes in kinds]
        if self.has_resid:
            out.append(("resid", self.n_layers + 1, (p, t, self.d_model), stored))
        return out

    def _qk_arrays(self) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
        facts = self.index.qk
        if facts is None:
            return []
        p, h, t = len(self.prompts), self.n_heads, self.index.longest or 0
        stored = (STORED_AS[facts.dtype],)
        if facts.dtype == "float16":
            stored += ("float32",)  # widened if it would overflow
        return [("q", (p, h, t, facts.d_head), stored),
                ("k", (p, facts.kv_heads, t, facts.d_head), stored),
                ("lse", (p, h, t), ("float32",)),
                *([("first", (p, h, t), ("float32",))] if facts.first else []),
                *([("received", (p, h, t), ("float32",))] if facts.received else [])]

    def array_names(self) -> list[str]:
        """The arrays of the recording's Zarr group, as its index implies them
        (``attn/L000``, ``resid/B000``, ...); none for a format-1 recording."""
        if self._group is None:
            return []
        return [zarr_store.array_name(kind, layer)
                for kind, count, _, _ in self._arrays() for layer in range(count)]

    def array(self, name: str) -> np.ndarray:
        """The whole of array ``name`` (one of :meth:`array_names`), as stored, every chunk
        read through the checks of :class:`~workbench.recording.zarr_store.ConfinedStore`.

        Raises:
            WorkbenchError: no such array (the message lists them), or a file of it that is
                not a regular file inside the recording.
            ChecksumError: a chunk missing, unlisted or damaged.
        """
        known = self.array_names()
        if name not in known:
            raise WorkbenchError(f"{self.root} has no array {name!r}; its arrays: "
                                 f"{', '.join(known) or 'none'}")
        return self._read(name, (...,))

    def verify(self) -> None:
        """Check every file's SHA-256 against the index (each chunk file, for format 2).

        Raises:
            ChecksumError: a file changed since it was written, or (format 2) a file in
                the group the index does not list; the message names the file.
        """
        files = self.index.files
        if self._group is not None:
            if (problem := zarr_store.manifest_problem(self.root, files)) is not None:
                raise ChecksumError(problem)
            return
        for rel, entry in files.items():
            if checksums.sha256_file(self.root / rel) != entry.sha256:
                raise ChecksumError(f"checksum mismatch for {self.root / rel}")

    def __len__(self) -> int:
        return len(self.prompts)

    def __repr__(self) -> str:
        return (f"Recording({str(self.root)!r}, {self.model.name}, {len(self.prompts)} prompts, "
                f"patterns={self.patterns})")

    def tokens(self, prompt: int) -> list[str]:
        """Token strings of prompt ``prompt``."""
        return list(self._prompt(prompt).tokens)

    def length(self, prompt: int) -> int:
        """The number of tokens of prompt ``prompt``."""
        return len(self._prompt(prompt).token_ids)

    @property
    def has_resid(self) -> bool:
        return self.index.has_resid

    def pattern(self, prompt: int, layer: int, head: int | None = None, *,
                queries: Queries = None, keys: Queries = None
                ) -> Float[np.ndarray, "*head query key"]:
        """Attention weights ``[query, key]`` of one head, or ``[head, query, key]`` of all.

        Of a ``topk`` recording this is a dense view of the sparse form: the kept weights
        and the exact first-token, diagonal and previous-token weights at their keys, and 0
        elsewhere; the left-out mass is spread nowhere, so a row sums to less than 1.

        Args:
            prompt: the prompt.
            layer: the layer.
            head: one head, or all.
            queries: only query rows ``(start, stop)`` (only their chunks are read).
            keys: only keys ``(start, stop)`` (of a ``qk`` recording only they are
                computed).

        Returns:
            float32 weights over every key of the prompt, or over ``keys``.

        Raises:
            WorkbenchError: a range outside the prompt, or a view over
                :data:`DENSE_VIEW_BYTES` (one line).
        """
        n = self.length(prompt)
        q0, q1 = self._query_range(prompt, layer, head, queries)
        k0, k1 = (0, n) if keys is None else keys
        if not 0 <= k0 < k1 <= n:
            raise WorkbenchError(f"keys {k0}..{k1} are not inside 0..{n}")
        width = n if self.patterns == "topk" else k1 - k0  # topk: made over every key
        size = (self.n_heads if head is None else 1) * (q1 - q0) * width * 4
        if size > DENSE_VIEW_BYTES:
            raise WorkbenchError(
                f"a dense view of {size // ((q1 - q0) * width * 4)} x {q1 - q0} x "
                f"{width} weights is {size / 2**30:.1f} GiB, over "
                f"{DENSE_VIEW_BYTES / 2**30:.0f} GiB: read one head, fewer query rows "
                "(queries=(start, stop)), or pooled(); of a qk recording, tile()")
        if self.patterns == "topk":
            rows = self.pattern_sparse(prompt, layer, head, queries=queries).dense(n)
            return rows[..., k0:k1]
        if self.patterns == "qk":
            qk = self.qk_layer(prompt, layer)
            heads = range(self.n_heads) if head is None else [head]
            tiles = np.stack([qk.tile(h, slice(q0, q1), slice(k0, k1)).numpy() for h in heads])
            return tiles if head is None else tiles[0]
        heads = slice(None) if head is None else head
        if self._group is None:
            block = legacy.block(self.root, self.index, "attn", layer, prompt,
                                 (self.n_heads, n, n))
            return np.array(block[heads, q0:q1, k0:k1], dtype=np.float32)
        block = self._read(zarr_store.array_name("attn", layer),
                           (prompt, heads, slice(q0, q1), slice(k0, k1)))
        return block.astype(np.float32, copy=False)

    def pattern_sparse(self, prompt: int, layer: int, head: int | None = None, *,
                       queries: Queries = None) -> sparse.SparsePattern:
        """The sparse form of one head's (or every head's) pattern rows.

        A ``topk`` recording returns what it stored; a dense one computes the same form
        from its rows (with k = 16), so both read alike.

        Args:
            prompt: the prompt.
            layer: the layer.
            head: one head, or all.
            queries: only query rows ``(start, stop)``.

        Returns:
            The kept weights and keys and the exact channels of those rows.
        """
        q0, q1 = self._query_range(prompt, layer, head, queries)
        heads = slice(None) if head is None else head
        if self.patterns == "topk":
            parts = {kind: self._read(zarr_store.array_name(kind, layer),
                                      (prompt, heads, slice(q0, q1)))
                     for kind in ("topk_weights", "topk_keys", "exact")}
        else:
            rows = torch.from_numpy(self.pattern(prompt, layer, queries=(q0, q1)))
            found = sparse.topk_rows(rows, q0=q0, k=DEFAULT_TOPK)
            parts = {"topk_weights": found["weights"][heads], "topk_keys": found["keys"][heads],
                     "exact": found["exact"][heads]}
        exact = parts["exact"]
        return sparse.SparsePattern(
            weights=parts["topk_weights"], keys=parts["topk_keys"], first=exact[..., 0],
            diagonal=exact[..., 1], previous=exact[..., 2], left_out=exact[..., 3],
            queries=np.arange(q0, q1))

    def qk_layer(self, prompt: int, layer: int) -> QKLayer:
        """The stored queries, keys and row log-sum-exps of one prompt at one layer of a
        ``qk`` recording, from which any of its weights is computed (:class:`QKLayer`).

        Raises:
            WorkbenchError: not a ``qk`` recording, or a prompt or layer out of range.
        """
        facts = self.index.qk
        if facts is None:
            raise WorkbenchError(f"{self.root} stores {self.patterns} patterns, not qk "
                                 "(record with --patterns qk)")
        n = self.length(prompt)
        self._check(layer, self.n_layers, "layer")
        kept = self._qk_layers.get((prompt, layer))
        if kept is not None:
            return kept
        q, k, lse = (from_stored(self._read(zarr_store.array_name(kind, layer),
                                            (prompt, slice(None), slice(0, n))))
                     for kind in ("q", "k", "lse"))
        slopes = None if facts.alibi is None else facts.alibi[layer]
        made = QKLayer(q, k, lse, facts.scale[layer], facts.softcap[layer],
                       Mask(causal=facts.causal, window=facts.window[layer]),
                       None if slopes is None else torch.tensor(slopes, dtype=torch.float32))
        if len(self._qk_layers) >= QK_LAYERS_KEPT:  # the oldest goes
            self._qk_layers.pop(next(iter(self._qk_layers)))
        self._qk_layers[(prompt, layer)] = made
        return made

    def tile(self, prompt: int, layer: int, head: int, *, queries: slice = slice(None),
             keys: slice = slice(None)) -> Float[np.ndarray, "query key"]:
        """The exact weights of one head over ``queries`` x ``keys`` (position slices), 0
        where a query does not see a key, computed from a ``qk`` recording in
        O(rows x keys x d_head).

        Raises:
            WorkbenchError: not a ``qk`` recording, or a prompt, layer, head or range
                outside it (one line).
        """
        self._check(head, self.n_heads, "head")
        return self.qk_layer(prompt, layer).tile(head, queries, keys).numpy()

    def received(self, prompt: int, layer: int, head: int) -> Float[np.ndarray, " key"]:
        """The attention each key of the prompt receives from every query (the pattern's
        column sums), one block of rows at a time: exact from a ``qk`` or a dense
        recording (a ``qk`` one stores it, from the pass's own weights; one made before it
        was stored computes it from its queries and keys); from a ``topk`` one, the kept
        weights and exact channels only (a lower bound: the left-out mass is at no key)."""
        self._query_range(prompt, layer, head, None)
        if self.patterns == "qk" and self.index.qk is not None and self.index.qk.received:
            return self._read(zarr_store.array_name("received", layer),
                              (prompt, head, slice(0, self.length(prompt))))
        if self.patterns == "qk":  # a page redraws it with every change of pooling
            if (prompt, layer, head) not in self._received:
                if len(self._received) >= QK_LAYERS_KEPT * self.n_heads:  # the oldest goes
                    self._received.pop(next(iter(self._received)))
                self._received[(prompt, layer, head)] = \
                    self.qk_layer(prompt, layer).received(head).numpy()
            return self._received[(prompt, layer, head)].copy()
        n, out = self.length(prompt), np.zeros(self.length(prompt), dtype=np.float64)
        for r0 in range(0, n, zarr_store.QUERY_BLOCK):
            out += self.pattern(prompt, layer, head,
                                queries=(r0, min(r0 + zarr_store.QUERY_BLOCK, n))).sum(0)
        return out.astype(np.float32)

    def row_stats(self, prompt: int, layer: int, head: int) -> dict[str, np.ndarray]:
        """Each query row's entropy (nats), weight on the first and on the previous key,
        from a ``qk`` recording (:meth:`QKLayer.row_stats`)."""
        self._check(head, self.n_heads, "head")
        return {k: v.numpy() for k, v in self.qk_layer(prompt, layer).row_stats(head).items()}

    def first_key_mass(self, prompt: int, layer: int) -> Float[np.ndarray, " head_index"]:
        """Each head's mean weight on the first key, over every query but the first (which
        can only attend there): the sink score of one prompt, exact for every storage.

        Args:
            prompt: the prompt.
            layer: the layer.

        Returns:
            One mean weight per head (zeros for a prompt of one token).
        """
        n = self.length(prompt)
        if n < 2:
            self._query_range(prompt, layer, None, None)
            return np.zeros(self.n_heads, dtype=np.float32)
        if self.patterns == "topk":  # the exact channel holds the first key's weight
            first = self.pattern_sparse(prompt, layer, queries=(1, n)).first
        elif self.patterns == "qk" and self.index.qk is not None and self.index.qk.first:
            self._query_range(prompt, layer, None, None)  # the stored column, not the queries
            first = self._read(zarr_store.array_name("first", layer),
                               (prompt, slice(None), slice(1, n)))
        elif self.patterns == "qk":  # one column a head, not the [head, T, T] pattern
            if (prompt, layer) not in self._first_mass:
                qk = self.qk_layer(prompt, layer)
                self._first_mass[(prompt, layer)] = np.array([
                    qk.tile(h, slice(1, n), slice(0, 1))[:, 0].numpy().mean()
                    for h in range(self.n_heads)])
            return self._first_mass[(prompt, layer)].copy()
        else:
            first = self.pattern(prompt, layer, queries=(1, n))[..., 0]
        return first.mean(axis=-1)

    def pooled(self, prompt: int, layer: int, head: int, *,
               window: tuple[int, int, int, int] | None = None, max_cells: int = 512,
               how: sparse.Pooling = "max") -> Pooled:
        """One head's pattern over a window, pooled to at most ``max_cells`` a side.

        Only the chunks of the window's query rows are read, one query block at a time, so
        an 8,192-token overview never holds the dense ``[T, T]`` pattern. Of a ``topk``
        recording the kept weights and exact channels are pooled (the left-out mass is in
        no cell); of a ``qk`` one, every weight, computed only where a block of rows sees
        keys (:meth:`QKLayer.pooled`).

        Args:
            prompt: the prompt.
            layer: the layer.
            head: the head.
            window: ``(q0, q1, k0, k1)``, query and key ranges; default the whole pattern.
            max_cells: the largest number of cells a side.
            how: ``max`` or ``sum`` pooling.

        Returns:
            The pooled grid and how it was made.
        """
        if how not in ("max", "sum"):
            raise WorkbenchError(f"pooling must be max or sum, got {how!r}")
        n = self.length(prompt)
        q0, q1, k0, k1 = window if window is not None else (0, n, 0, n)
        if not (0 <= q0 < q1 <= n and 0 <= k0 < k1 <= n):
            raise WorkbenchError(f"window {(q0, q1, k0, k1)} is not inside 0..{n}")
        factor = sparse.cells(max(q1 - q0, k1 - k0), max_cells)
        shape = (q1 - q0, k1 - k0)
        if self.patterns == "topk":
            rows = self.pattern_sparse(prompt, layer, head, queries=(q0, q1))
            grid = _pool_sparse(rows, (q0, k0), shape, factor, how)
        elif self.patterns == "qk":
            self._check(head, self.n_heads, "head")
            grid = self.qk_layer(prompt, layer).pooled(
                head, slice(q0, q1), slice(k0, k1), factor, how).numpy()
        else:
            # row blocks that are whole multiples of the cell size, about one chunk each
            step = factor * max(1, zarr_store.QUERY_BLOCK // factor)
            grid = np.concatenate([sparse.pool_dense(
                self.pattern(prompt, layer, head, queries=(r0, min(r0 + step, q1)),
                             keys=(k0, k1)), factor, how) for r0 in range(q0, q1, step)])
        return Pooled(grid=grid, factor=factor, how=how, window=(q0, q1, k0, k1))

    def check_head(self, prompt: int, layer: int, head: int) -> None:
        """Refuse a prompt, layer or head this recording does not have.

        Raises:
            WorkbenchError: an index that is not a whole number in range.
        """
        self._check(prompt, len(self.prompts), "prompt")
        self._check(layer, self.n_layers, "layer")
        self._check(head, self.n_heads, "head")

    def show_pattern(self, prompt: int, layer: int, head: int, **options: Any) -> go.Figure:
        """Deprecated: ``workbench.show_pattern(rec, prompt, layer, head, **options)``.

        .. deprecated:: 0.1.0
            Goes in the next release; a recording no longer knows how it is drawn.
        """
        warnings.warn("Recording.show_pattern is deprecated; use workbench.show_pattern(rec, "
                      "prompt, layer, head, ...)", DeprecationWarning, stacklevel=2)
        from workbench.views.patterns import show_pattern  # the view sits above the recording

        return show_pattern(self, prompt, layer, head, **options)

    def show_long(self, prompt: int, layer: int, head: int, *args: Any,
                  **options: Any) -> go.Figure:
        """Deprecated: ``workbench.show_long(rec, prompt, layer, head, **options)``.

        .. deprecated:: 0.1.0
            Goes in the next release; a recording no longer knows how it is drawn.
        """
        warnings.warn("Recording.show_long is deprecated; use workbench.show_long(rec, "
                      "prompt, layer, head, ...)", DeprecationWarning, stacklevel=2)
        from workbench.views.patterns import show_long  # the view sits above the recording

        return show_long(self, prompt, layer, head, *args, **options)

    def resid(self, prompt: int, layer: int) -> Float[np.ndarray, "pos d_model"]:
        """Residual stream ``[pos, d_model]`` at boundary ``layer`` (0 .. n_layers)."""
        if not self.has_resid:
            raise WorkbenchError(f"{self.root} recorded attention patterns only")
        self._check(layer, self.n_layers + 1, "layer boundary")
        n = self.length(prompt)
        if self._group is None:
            block = legacy.block(self.root, self.index, "resid", layer, prompt,
                                 (n, self.d_model))
            return np.array(block, dtype=np.float32)
        block = self._read(zarr_store.array_name("resid", layer), (prompt, slice(0, n)))
        return block.astype(np.float32, copy=False)

    def _read(self, name: str, where: tuple[Any, ...]) -> np.ndarray:
        """A slice of one array; a chunk that fails its CRC-32C is a ChecksumError."""
        assert self._group is not None
        try:
            return np.asarray(cast("zarr.Array", self._group[name])[where])  # an array, not a group
        except ValueError as exc:  # Crc32cCodec: "Stored and computed checksum do not match"
            raise ChecksumError(f"{self.root / zarr_store.GROUP / name}: a chunk is damaged "
                                f"({exc}); `Recording.verify()` names it") from None

    def _query_range(self, prompt: int, layer: int, head: int | None,
                     queries: Queries) -> tuple[int, int]:
        """Check a pattern read's arguments; its query rows ``(start, stop)``."""
        if self.patterns == "none":
            raise WorkbenchError(f"{self.root} recorded no attention patterns (patterns none)")
        n = self.length(prompt)
        self._check(layer, self.n_layers, "layer")
        if head is not None:
            self._check(head, self.n_heads, "head")
        q0, q1 = (0, n) if queries is None else queries
        if not 0 <= q0 < q1 <= n:
            raise WorkbenchError(f"query rows {q0}..{q1} are not inside 0..{n}")
        return q0, q1

    def _prompt(self, prompt: int) -> RecordedPrompt:
        self._check(prompt, len(self.prompts), "prompt")
        return self.prompts[prompt]

    @staticmethod
    def _check(value: int, bound: int, what: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise WorkbenchError(f"{what} must be a whole number, got {value!r}")
        if not 0 <= value < bound:
            raise WorkbenchError(f"{what} {value} is out of range 0..{bound - 1}")


def _pool_sparse(rows: sparse.SparsePattern, corner: tuple[int, int], shape: tuple[int, int],
                 factor: int, how: sparse.Pooling) -> Float[np.ndarray, "qcell kcell"]:
    """Pool one head's sparse rows: the kept weights, and each exact channel whose key is
    not among the row's kept keys (so ``sum`` counts every position once)."""
    q = rows.queries[:, None]
    kept = rows.keys != rows.sentinel
    r = [np.broadcast_to(q, rows.keys.shape)[kept]]
    c, v = [rows.keys[kept].astype(np.int64)], [rows.weights[kept]]
    for key, value in ((np.zeros_like(rows.queries), rows.first),
                       (rows.queries, rows.diagonal), (rows.queries - 1, rows.previous)):
        # key 0 is the first token's: the diagonal of query 0 and the previous token of
        # query 1 are that same position, already placed as ``first``
        fresh = ~(rows.keys == key[:, None]).any(-1) & (key >= (0 if value is rows.first else 1))
        r.append(rows.queries[fresh])
        c.append(key[fresh].astype(np.int64))
        v.append(value[fresh])
    q0, k0 = corner
    return sparse.pool_entries(np.concatenate(r) - q0, np.concatenate(c) - k0,
                               np.concatenate(v), shape, factor, how)
