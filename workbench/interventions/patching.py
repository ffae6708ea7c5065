"""Activation patching: clean activations patched into a corrupted run, one site at a time.

Two inputs of the same length differ where it matters (the IOI names, say): the *clean*
run gives the behaviour, the *corrupted* one does not. Each patched run is the corrupted
input with one activation replaced by its value on the clean input, then the rest of the
model run as it is (TransformerLens' ``patching`` module, "denoising"). The metric is a
logit difference read at each row's answer position
(:func:`workbench.scores.logit_attribution.logit_difference`), normalised::

    normalised = (mean patched - mean corrupted) / (mean clean - mean corrupted)

over the prompts, so 0 is the corrupted run and 1 the clean one (a ratio of means; its 95%
interval is a bootstrap over prompts, :func:`workbench.scores.stats.bootstrap_ratio_ci`).

Sites (:data:`Site`): the residual stream entering a block (``resid_pre``), the attention
and MLP outputs (``attn_out``, ``mlp_out``), each at one position of a layer, and one
head's output (``z``, the head's ``hook_z`` before the output projection) at every
position. A grid's *cells* are positions (or heads), plus :data:`EVERY` (every position,
or every head, at once) and :data:`NOTHING` (a patched run that writes nothing): the
checks the machinery answers for itself, since every position of ``resid_pre`` patched is
the clean run (normalised 1) and nothing patched is the corrupted run (0).

How: the cells of one layer run as copies of the corrupted batch in one pass, each copy
patching its own cell; the blocks below the layer compute what the corrupted run did, so
they are replayed from it (:mod:`workbench.interventions.replay`), not run again. A cell
whose clean activation is the corrupted one (a position before the first token the two
inputs differ in) is the corrupted run, and is not run. Every pass stops at the final
norm's output; only the columns of the two tokens are unembedded.

Examples:
    >>> pair = Pair(clean_ids, corrupted_ids, Contrast(io, s), positions)   # doctest: +SKIP
    >>> grid = patch_grid(model, pair, "resid_pre")                         # doctest: +SKIP
    >>> grid.normalised()[:, grid.cells.index(EVERY)]                      # doctest: +SKIP
    array([1., 1., ...])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.inputs.batching import Batch
from workbench.interventions import replay
from workbench.models.base import Model
from workbench.recording import hooks
from workbench.scores.logit_attribution import Contrast, logit_difference, readout
from workbench.scores.stats import bootstrap_ratio_ci

Site = Literal["resid_pre", "attn_out", "mlp_out", "z"]
"""What one patch replaces: the residual stream entering a block, the attention or MLP
output, at one position; or one head's output at every position."""
SITES: tuple[str, ...] = get_args(Site)
EVERY = -1
"""The cell patching every position (every head, for ``z``) of the layer at once."""
NOTHING = -2
"""The cell that patches nothing: the corrupted run through the same machinery."""


def site_hook(site: Site, layer: int, n_layers: int) -> str:
    """The hook point a site patches."""
    if site == "resid_pre":
        return hooks.resid(layer, n_layers)
    if site == "attn_out":
        return hooks.attn_out(layer)
    if site == "mlp_out":
        return hooks.mlp_out(layer)
    if site == "z":
        return hooks.z(layer)
    raise WorkbenchError(f"site must be one of {', '.join(SITES)}, got {site!r}")


@dataclass(frozen=True)
class Pair:
    """Clean and corrupted inputs of one shape (no padding), the logit difference each row
    is measured by, and the position it is read at."""

    clean: Int[Tensor, "batch pos"]
    corrupted: Int[Tensor, "batch pos"]
    contrast: Contrast
    positions: Int[Tensor, " batch"]

    def __post_init__(self) -> None:
        if self.clean.shape != self.corrupted.shape or self.clean.dim() != 2:
            raise WorkbenchError(f"clean and corrupted inputs must be [batch, pos] of one "
                                 f"shape, got {tuple(self.clean.shape)} and "
                                 f"{tuple(self.corrupted.shape)}")
        n, width = self.clean.shape
        if self.contrast.answer.shape != (n,) or self.positions.shape != (n,):
            raise WorkbenchError(f"a pair of {n} rows needs {n} answers and positions")
        if self.positions.numel() and not (int(self.positions.min()) >= -width
                                           and int(self.positions.max()) < width):
            raise WorkbenchError(f"answer positions must be inside the {width} tokens")

    def rows(self, index: slice) -> Pair:
        c = self.contrast
        return Pair(self.clean[index], self.corrupted[index],
                    Contrast(c.answer[index], None if c.other is None else c.other[index]),
                    self.positions[index])


@dataclass
class PatchGrid:
    """The metric of every patched run of one site: ``values[prompt, layer, cell]``."""

    site: Site
    layers: list[int]
    cells: list[int]
    """positions (heads for ``z``), :data:`EVERY` or :data:`NOTHING`"""
    values: Float[np.ndarray, "prompt layer cell"]
    clean: Float[np.ndarray, " prompt"]
    corrupted: Float[np.ndarray, " prompt"]

    def normalised(self) -> Float[np.ndarray, "layer cell"]:
        """``(mean patched - mean corrupted) / (mean clean - mean corrupted)``."""
        return ((self.values.mean(0) - self.corrupted.mean())
                / (self.clean.mean() - self.corrupted.mean()))

    def interval(self, *, n_boot: int = 1000, seed: int = 0
                 ) -> tuple[Float[np.ndarray, "layer cell"], Float[np.ndarray, "layer cell"]]:
        """The 95% bootstrap interval over prompts of :meth:`normalised`."""
        return bootstrap_ratio_ci(self.values - self.corrupted[:, None, None],
                                  self.clean - self.corrupted, n_boot=n_boot, seed=seed)


def default_cells(model: Model, pair: Pair, site: Site) -> list[int]:
    """Every position (every head, for ``z``), then :data:`EVERY`."""
    count = model.info.n_heads if site == "z" else pair.clean.shape[1]
    return [*range(count), EVERY]


def _writer(site: Site, cells: Sequence[int], clean: Tensor, n: int
            ) -> Callable[[Tensor, Any], Tensor]:
    """A hook giving copy ``k`` of the batch (rows ``k*n .. k*n+n-1``) the clean value of
    cell ``cells[k]``."""
    def hook(tensor: Tensor, hook: Any) -> Tensor:
        tensor = tensor.clone()  # the pass's own tensor, not a kept one
        for k, cell in enumerate(cells):
            rows = slice(k * n, (k + 1) * n)
            if cell == NOTHING:
                continue
            if cell == EVERY:
                tensor[rows] = clean
            elif site == "z":
                tensor[rows, :, cell] = clean[:, :, cell]
            else:
                tensor[rows, cell] = clean[:, cell]
        return tensor
    return hook


def _same(site: Site, cell: int, clean: Tensor, corrupted: Tensor) -> bool:
    """Whether patching ``cell`` writes exactly what the corrupted run has there (never for
    :data:`NOTHING`, which is run to check the machinery)."""
    if cell == NOTHING:
        return False
    if cell == EVERY:
        return torch.equal(clean, corrupted)
    if site == "z":
        return torch.equal(clean[:, :, cell], corrupted[:, :, cell])
    return torch.equal(clean[:, cell], corrupted[:, cell])


def patch_grid(model: Model, pair: Pair, site: Site, *, layers: Sequence[int] | None = None,
               cells: Sequence[int] | None = None, max_batch_tokens: int = 2048,
               desc: str | None = None) -> PatchGrid:
    """Patch every cell of every layer of ``site`` from the clean run into the corrupted
    one and read the metric.

    Args:
        model: a causal LM.
        pair: the inputs and the metric.
        site: see :data:`Site`.
        layers: the layers patched (default all).
        cells: positions (heads for ``z``), :data:`EVERY`, :data:`NOTHING` (default
            :func:`default_cells`).
        max_batch_tokens: tokens per forward pass, copies included (a pass holds at least
            one copy of at least one row).
        desc: a progress label (default ``patch <site>``).

    Returns:
        The grid, with the clean and corrupted metrics of each prompt.

    Raises:
        WorkbenchError: a layer or cell the model or the inputs do not have.
    """
    n_layers = model.info.n_layers
    layers = list(range(n_layers)) if layers is None else list(layers)
    cells = default_cells(model, pair, site) if cells is None else list(cells)
    _check(model, pair, site, layers, cells)
    n, width = pair.clean.shape
    names = {layer: site_hook(site, layer, n_layers) for layer in layers}
    values = np.full((n, len(layers), len(cells)), np.nan)
    clean, corrupted = np.full(n, np.nan), np.full(n, np.nan)
    rows_per_pass = max(1, max_batch_tokens // width)
    groups = [slice(i, min(i + rows_per_pass, n)) for i in range(0, n, rows_per_pass)]
    with torch.inference_mode():
        for group in groups:
            clean[group], corrupted[group], values[group] = _patch_rows(
                model, pair.rows(group), site, layers, names, cells, rows_per_pass,
                desc or f"patch {site}")
    return PatchGrid(site, layers, cells, values, clean, corrupted)


def _patch_rows(model: Model, sub: Pair, site: Site, layers: list[int], names: dict[int, str],
                cells: list[int], rows_per_pass: int, desc: str
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One group of rows of :func:`patch_grid`: the clean and corrupted metric of each row,
    and the metric with each cell of each layer patched, ``[row, layer, cell]``; the
    patched passes repeat the rows as often as ``rows_per_pass`` allows, one cell a copy."""
    b = sub.clean.shape[0]
    kept = hooks.capture(model, Batch.of(sub.clean),
                         [*dict.fromkeys(names.values()), hooks.FINAL_OUT])
    rows = torch.arange(b)
    clean = readout(model, kept[hooks.FINAL_OUT][rows, sub.positions],
                    sub.contrast).double().numpy()
    with replay.kept(model.bridge) as prefix:
        other = hooks.capture(model, Batch.of(sub.corrupted),
                              [*dict.fromkeys(names.values()), hooks.FINAL_OUT])
    corrupted = readout(model, other[hooks.FINAL_OUT][rows, sub.positions],
                        sub.contrast).double().numpy()
    values = np.full((b, len(layers), len(cells)), np.nan)
    passes = []
    for li, layer in enumerate(layers):
        # a cell whose clean value is the corrupted one (a position before the first
        # changed token) patches nothing: its run is the corrupted run
        name = names[layer]
        live = [c for c, cell in enumerate(cells)
                if not _same(site, cell, kept[name], other[name])]
        values[:, li] = corrupted[:, None]
        copies = max(1, rows_per_pass // b)
        passes += [(li, live[i: i + copies]) for i in range(0, len(live), copies)]
    for li, chunk in progress.track(passes, desc=desc):
        k, name = len(chunk), names[layers[li]]
        writer = _writer(site, [cells[c] for c in chunk], kept[name], b)
        with replay.replayed(model.bridge, prefix, layers[li], copies=k), \
                model.bridge.hooks(fwd_hooks=[(name, writer)]):
            got = logit_difference(model, Batch.of(sub.corrupted).repeat(k),
                                   sub.contrast.repeat(k), sub.positions.repeat(k))
        values[:, li, chunk] = got.double().reshape(k, b).T.numpy()
    return clean, corrupted, values


def _check(model: Model, pair: Pair, site: Site, layers: list[int], cells: list[int]) -> None:
    site_hook(site, 0, model.info.n_layers)  # an unknown site raises
    bad = [la for la in layers if not 0 <= la < model.info.n_layers]
    if bad:
        raise WorkbenchError(f"layers {bad} do not exist: {model.info.name} has "
                             f"{model.info.n_layers}")
    count = model.info.n_heads if site == "z" else pair.clean.shape[1]
    what = "heads" if site == "z" else "positions"
    wrong = [c for c in cells if c not in (EVERY, NOTHING) and not 0 <= c < count]
    if wrong:
        raise WorkbenchError(f"{what} {wrong} do not exist (0 .. {count - 1}; {EVERY}: every "
                             f"one, {NOTHING}: nothing)")
