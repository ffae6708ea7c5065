"""Path patching into one input of a head: upstream components removed from (or replaced in)
its Q, K or V only.

Ablating a head's output (:mod:`workbench.interventions.ablation`) removes it from every
downstream query, key and value and from the residual stream at once: it shows the head is
*necessary*, not through which input it acts. :func:`path_removed` removes chosen upstream
components (``embed``, heads ``LxHy``, MLPs ``LxMLP``) from the query, key or value input of
chosen target heads only; everything else in the model still sees them.

How: at each target layer, the first norm's scale is frozen at its value on the input (the
linearisation of :mod:`workbench.models.norms`), so a component's part of the
projection is ``W n(c)``; the hook on ``hook_q`` / ``hook_k`` / ``hook_v`` subtracts it,
at every position. The norms that sit elsewhere on the path are frozen too: a head's
output is taken through its block's attention output norm (Gemma's
``post_attention_layernorm``) at that norm's scale on the input, and a per-head query or
key norm after ``hook_q`` / ``hook_k`` (Gemma 3, Qwen 3) keeps the scale of the unpatched
query or key, so what is removed is exactly the linear part the QK attribution reports.
The sources are read in the same pass, as the (possibly already patched) model computes
them. With grouped-query attention ``k`` and ``v`` are shared by
the query heads of a key-value group, so removing a source from a target's key or value
removes it for the whole group; ``q`` is per head. Patching at layer ``L`` leaves layers
below it untouched, so a target's own pattern at ``L`` reflects the key path alone.

:func:`path_patched` *replaces* the sources instead: their outputs on another input (the
corrupted run of activation patching, :func:`source_outputs`) take the place of their
outputs on this one in the targets' input only, ``W n(c_other - c)`` added: Wang et al.'s
path patching from a sender to receivers' queries (2022), with the direct path alone
patched (no intermediate head sees the change) and the receivers' norm scale frozen at its
value on this input (the linearisation above). Where the attention output passes through a
norm before the residual add (``ln1_post``: Gemma 2/3, OLMo 2), a head's part is its output
through that norm, frozen at this pass's scale too
(:func:`workbench.models.norms.output_norm`).

Examples:
    >>> with path_removed(model, ["L3H1", "L4H0"], [(5, 1)], "k"):     # doctest: +SKIP
    ...     patterns = reduce_patterns(model, prompts, {"induction": induction})
    >>> other = source_outputs(model, corrupted_batch, ["L7H3"])       # doctest: +SKIP
    >>> with path_patched(model, ["L7H3"], [(9, 9)], "q", other):      # doctest: +SKIP
    ...     diff = logit_difference(model, clean_batch, contrast, positions)
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from workbench.core.errors import WorkbenchError
from workbench.inputs.batching import Batch
from workbench.interventions.ablation import Head
from workbench.models.base import Model
from workbench.models.norms import EMBED, first_norm, head_norm, normalise, output_norm
from workbench.recording import hooks

InputPath = Literal["q", "k", "v"]
"""Which input of the target heads a source is removed from."""
_SOURCE = re.compile(r"^L(?P<layer>[0-9]+)(?:H(?P<head>[0-9]+)|(?P<mlp>MLP))$")


def parse_source(name: str, model: Model) -> tuple[str, int, int | None]:
    """``embed``, ``LxHy`` or ``LxMLP`` as ``(kind, layer, head)`` (embed has layer -1).

    Raises:
        WorkbenchError: an unknown name, or a layer or head the model does not have.
    """
    if name == EMBED:
        return "embed", -1, None
    match = _SOURCE.match(name)
    if match is None:
        raise WorkbenchError(f"unknown component {name!r}; expected embed, LxHy (a head) or "
                             "LxMLP")
    layer = int(match["layer"])
    head = None if match["mlp"] else int(match["head"])
    info = model.info
    if layer >= info.n_layers or (head is not None and head >= info.n_heads):
        raise WorkbenchError(f"component {name} does not exist: {info.name} has "
                             f"{info.n_layers} layers of {info.n_heads} heads")
    return ("mlp" if head is None else "head"), layer, head


@contextlib.contextmanager
def path_removed(model: Model, sources: Sequence[str], targets: Sequence[Head],
                 path: InputPath) -> Iterator[None]:
    """Run the block with ``sources`` removed from the ``path`` input of ``targets`` only.

    Args:
        model: a pre-norm model (:func:`workbench.scores.qk_attribution.require_pre_norm`).
        sources: upstream components (``embed``, ``LxHy``, ``LxMLP``); a source at or
            above a target's layer cannot feed it and is left alone for that target.
        targets: ``(layer, head)`` heads whose input is patched.
        path: ``q``, ``k`` or ``v``.

    Raises:
        WorkbenchError: an unknown source, target or path.
    """
    with path_patched(model, sources, targets, path, None):
        yield


@contextlib.contextmanager
def path_patched(model: Model, sources: Sequence[str], targets: Sequence[Head],
                 path: InputPath, other: dict[str, Tensor] | None) -> Iterator[None]:
    """Run the block with ``sources``' outputs replaced by ``other`` in the ``path`` input
    of ``targets`` only (removed, where ``other`` is ``None``).

    Args:
        model: a pre-norm model.
        sources: upstream components, as for :func:`path_removed`.
        targets: ``(layer, head)`` heads whose input is patched.
        path: ``q``, ``k`` or ``v``.
        other: each source's output on the other input (:func:`source_outputs` of a
            batch of the same shape as every pass run in the block), or ``None``.

    Raises:
        WorkbenchError: an unknown source, target or path, or a source ``other`` lacks.
    """
    if path not in ("q", "k", "v"):
        raise WorkbenchError(f"path must be q, k or v, got {path!r}")
    parsed = [parse_source(s, model) for s in sources]
    info = model.info
    for layer, head in targets:
        if not (0 <= layer < info.n_layers and 0 <= head < info.n_heads):
            raise WorkbenchError(f"target head L{layer}H{head} does not exist in {info.name}")
    if other is not None and (missing := [s for s in sources if s not in other]):
        raise WorkbenchError(f"no output on the other input for {', '.join(missing)}")
    with model.bridge.hooks(fwd_hooks=_PathPatch(model, parsed, list(targets), path,
                                                    other).fwd_hooks()), \
            warnings.catch_warnings():
        # a target's q/k norm scale is frozen by editing its hook_scale, which the bridge
        # warns takes its norm off the native path: that edit is the patch's own
        warnings.filterwarnings("ignore", message=".*edited hook_scale/hook_normalized.*")
        yield


def read_points(model: Model, layers: Iterable[int]) -> list[str]:
    """The hook points a path patch reads in ``layers`` and before them: the embeddings,
    each layer's head outputs and, where the layer has one, the scale of its attention
    output norm. Blocks replayed under a path patch
    (:func:`workbench.interventions.replay.kept`) must keep these, or the patch cannot
    read its sources there."""
    n_layers = model.info.n_layers
    names = [hooks.resid(0, n_layers)]
    for layer in sorted(set(layers)):
        names.append(hooks.z(layer))
        if output_norm(model, layer) is not None:
            names.append(hooks.output_norm_scale(layer))
    return names


def source_outputs(model: Model, batch: Batch, sources: Sequence[str]) -> dict[str, Tensor]:
    """The outputs of ``sources`` on ``batch`` as a path patch reads them (a head's
    ``z W_O`` before any output norm), ``[batch, pos, d_model]`` each: one pass, stopped
    after the deepest source.

    Raises:
        WorkbenchError: an unknown source.
    """
    parsed = [parse_source(s, model) for s in sources]
    n_layers = model.info.n_layers
    names = [_source_hook(kind, layer, n_layers) for kind, layer, _ in parsed]
    w_o = model.bridge.W_O.detach()
    kept = hooks.capture(model, batch, names)
    out = {}
    for name, (kind, layer, head), hook_name in zip(sources, parsed, names, strict=True):
        value = kept[hook_name]
        out[name] = value[:, :, head] @ w_o[layer, head] if kind == "head" else value
    return out


def _source_hook(kind: str, layer: int, n_layers: int) -> str:
    if kind == "embed":
        return hooks.resid(0, n_layers)
    return hooks.z(layer) if kind == "head" else hooks.mlp_out(layer)


class _PathPatch:
    """The hooks of one path patch: they read the sources' outputs as the pass runs, each
    target layer's norm scale (and the sources' output norm scales), and add the sources'
    change (``other - own``, or ``-own``) projected at the target layer's ``hook_{path}``."""

    def __init__(self, model: Model, sources: list[tuple[str, int, int | None]],
                 targets: list[Head], path: InputPath, other: dict[str, Tensor] | None
                 ) -> None:
        bridge = model.bridge
        self.model, self.sources, self.targets = model, sources, targets
        self.path: InputPath = path
        self.other = other
        self.seen: list[tuple[int, str, Tensor]] = []  # (origin layer, kind, [batch, pos, d_model])
        self.target_layers = sorted({layer for layer, _ in targets})
        self.post = {layer: norm for kind, layer, _ in sources
                     if kind == "head" and (norm := output_norm(model, layer)) is not None}
        self.scales, self.keep_scales = hooks.caching_hooks(
            [hooks.norm_scale(layer) for layer in self.target_layers]
            + [hooks.output_norm_scale(layer) for layer in self.post])
        self.w_o = bridge.W_O.detach()
        self.weights = {"q": bridge.W_Q, "k": bridge.W_K, "v": bridge.W_V}[path].detach()
        self.named = {parse_source(name, model): name for name in (other or {})}
        # a per-head q/k norm after hook_q/hook_k: its scale is frozen at the unpatched value
        self.head_norms = {layer: head_norm(model, layer, path) if path != "v" else None
                           for layer in self.target_layers}
        self.frozen: dict[int, Tensor] = {}

    def fwd_hooks(self) -> list[tuple[str, Any]]:
        """``(hook point, hook)`` of every hook, for ``bridge.hooks(fwd_hooks=...)``."""
        info = self.model.info
        per_group = info.n_heads // info.n_kv_heads
        sources = self.sources
        fwd: list[tuple[str, Any]] = [*self.keep_scales,
                                      (hooks.resid(0, info.n_layers), self.embed)]
        for layer in sorted({layer for kind, layer, _ in sources if kind == "head"}):
            heads = [h for kind, src_layer, h in sources
                     if kind == "head" and src_layer == layer and h is not None]
            fwd.append((hooks.z(layer), self.head_out(layer, heads)))
        for layer in sorted({layer for kind, layer, _ in sources if kind == "mlp"}):
            fwd.append((hooks.mlp_out(layer), self.mlp_out(layer)))
        for layer in self.target_layers:
            heads = [h for target_layer, h in self.targets if target_layer == layer]
            indices = sorted(set(heads if self.path == "q" else [h // per_group for h in heads]))
            fwd.append((hooks.qkv(layer, self.path), self.patch(layer, indices)))
            if self.path != "v" and self.head_norms[layer] is not None:
                fwd.append((hooks.qk_norm_scale(layer, self.path), self.freeze(layer, indices)))
        return fwd

    def change(self, source: tuple[str, int, int | None], own: Tensor) -> Tensor:
        return (0 if self.other is None else self.other[self.named[source]]) - own

    def embed(self, x: Tensor, hook: Any) -> None:
        self.seen.clear()  # a new forward pass starts here
        if ("embed", -1, None) in self.sources:
            self.seen.append((-1, "embed", self.change(("embed", -1, None), x.detach())))

    def head_out(self, layer: int, heads: list[int]):
        def hook(z: Tensor, hook: Any) -> None:
            self.seen.extend((layer, "head", self.change(("head", layer, h), torch.einsum(
                "btd,dm->btm", z[:, :, h], self.w_o[layer, h]))) for h in heads)
        return hook

    def mlp_out(self, layer: int):
        def hook(x: Tensor, hook: Any) -> None:
            self.seen.append((layer, "mlp", self.change(("mlp", layer, None), x.detach())))
        return hook

    def part(self, origin: int, kind: str, value: Tensor) -> Tensor:
        """A source's change as it joins the residual stream: a head's through its layer's
        frozen output norm (whose scale fires after the head's own hook)."""
        if kind == "head" and origin in self.post:
            scale = self.scales[hooks.output_norm_scale(origin)][..., 0].double()
            return normalise(value.double(), scale, self.post[origin])
        return value.double()

    def patch(self, layer: int, indices: list[int]):
        norm = first_norm(self.model, layer)
        qk_norm = self.head_norms[layer]

        def hook(x: Tensor, hook: Any) -> Tensor:
            feeding = [self.part(origin, kind, t) for origin, kind, t in self.seen
                       if origin < layer]
            if not feeding:
                return x
            if qk_norm is not None:
                self.frozen[layer] = torch.stack([qk_norm.scale(x[:, :, i])
                                                  for i in indices], 1)  # [batch, index, pos]
            scale = self.scales[hooks.norm_scale(layer)][..., 0].double()
            added = normalise(torch.stack(feeding).sum(0), scale, norm).to(x.dtype)
            x = x.clone()
            for i in indices:
                x[:, :, i] += added @ self.weights[layer, i]
            return x
        return hook

    def freeze(self, layer: int, indices: list[int]):
        def hook(scale: Tensor, hook: Any) -> Tensor:  # [batch, head, pos, 1]
            if layer not in self.frozen:
                return scale
            scale = scale.clone()
            scale[:, indices, :, 0] = self.frozen.pop(layer).to(scale.dtype)
            return scale
        return hook
