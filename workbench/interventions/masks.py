"""Head masks: remove, scale or mean-ablate attention heads through hooks on the bridge.

A mask ``xi[layer, head]`` multiplies each query head's contribution before the output
projection, as in Michel et al. 2019 ("Are Sixteen Heads Really Better than One?"):
``MHA(x) = sum_h xi_h Att_h(x) W_O^h``. The hook sits on ``blocks.{l}.attn.hook_z``
(``[batch, pos, head_index, d_head]``, the per-head outputs that ``W_O`` mixes), so a
mask works unchanged for grouped-query models (it masks query heads; the shared key-value
heads are untouched) and for encoders.

Ablation kinds:

- ``zero``: ``z_h -> xi_h z_h``. With ``xi_h = 0`` the head is removed; with ``xi = 1``
  everywhere nothing changes, bit for bit.
- ``mean``: ``z_h -> xi_h z_h + (1 - xi_h) mean(z_h)``, the head's output replaced by its
  mean over every real token of a reference batch (:func:`head_means`).
- ``resample``: ``z_h[b] -> xi_h z_h[b] + (1 - xi_h) z_h[donor(b)]``, each prompt's output
  of the head replaced, position by position, by its output on a donor prompt of the same
  forward batch and the same real length (:func:`donors`): the prompts of each length form
  a random cycle drawn from the mask's ``seed``, so no prompt is its own donor and a
  donor's real positions are the prompt's own (batches are right-padded). The lengths are
  read off the attention mask the pass is given (:func:`watched`); a pass given none
  counts every position as real. A prompt with no other of its length in its batch is
  refused. The hooks run in the pass they change, so where heads of several layers are
  resampled, a donor's output at a higher layer is that of the already-ablated pass.

Masks compose by multiplication, save to and load from a small JSON file, and apply to
any run or recording (``--heads-mask FILE``).

Examples:
    >>> mask = HeadMask.ones(30, 9).without([(4, 2), (7, 0)])
    >>> mask.save("prune.json")                                      # doctest: +SKIP
    >>> with applied(model, HeadMask.load("prune.json")):            # doctest: +SKIP
    ...     logits = model.logits(ids)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.core.files import read_bounded
from workbench.core.options import Ablation
from workbench.core.records import RecordError
from workbench.core.values import shown
from workbench.inputs.prompts import Prompt, check_prompt_set, load_prompt_set, prompt_set_names
from workbench.models.base import Model
from workbench.recording import hooks
from workbench.store.records import MASK_FORMAT, HeadMaskFile

ABLATIONS: tuple[Ablation, ...] = get_args(Ablation)
FORMAT = MASK_FORMAT
MAX_FILE = 64 << 20
"""A mask file larger than this is not one (smollm2's is a few kilobytes)."""


@dataclass
class HeadMask:
    """A mask over (layer, query head).

    Attributes:
        values: ``[n_layers, n_heads]``; 1 keeps a head, 0 removes it.
        ablation: what a removed head is replaced by (``zero``, ``mean`` or ``resample``).
        reference: for ``mean``: the prompt set whose mean head outputs are used.
        model: the model the mask was made for (checked when it is applied).
        seed: for ``resample``: the seed of the donor permutation (:func:`donors`).
    """

    values: Float[Tensor, "layer head_index"]
    ablation: Ablation = "zero"
    reference: str = "natural"
    model: str | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.ablation not in ABLATIONS:
            raise WorkbenchError(
                f"unknown ablation '{self.ablation}'; expected one of {', '.join(ABLATIONS)}")
        if not 0 <= self.seed < 1 << 63:
            raise WorkbenchError(f"a head mask's seed is a whole number in [0, 2**63); got "
                                 f"{self.seed}")
        if self.values.ndim != 2:
            raise WorkbenchError(f"a head mask is [layer, head]; got shape "
                                 f"{tuple(self.values.shape)}")
        values = self.values.detach()
        bad = ~torch.isfinite(values) | (values < 0) | (values > 1)
        if bool(bad.any()):
            layer, head = (int(i) for i in bad.nonzero()[0])
            raise WorkbenchError(
                f"head mask value at layer {layer}, head {head} is "
                f"{float(values[layer, head])}; every value must be a number in [0, 1]")

    @classmethod
    def ones(cls, n_layers: int, n_heads: int, **kwargs: Any) -> HeadMask:
        return cls(torch.ones(n_layers, n_heads), **kwargs)

    @classmethod
    def for_model(cls, model: Model, **kwargs: Any) -> HeadMask:
        """An all-ones mask shaped for ``model``."""
        return cls.ones(model.info.n_layers, model.info.n_heads, model=model.info.name,
                        **kwargs)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.values.shape[0]), int(self.values.shape[1]))

    def removed(self) -> list[tuple[int, int]]:
        """The (layer, head) pairs whose value is 0."""
        return [(int(layer), int(head)) for layer, head in (self.values == 0).nonzero().tolist()]

    def without(self, heads: Iterable[tuple[int, int]]) -> HeadMask:
        """A copy with ``heads`` set to 0."""
        values = self.values.clone()
        for layer, head in heads:
            values[layer, head] = 0.0
        return HeadMask(values, self.ablation, self.reference, self.model, self.note,
                        dict(self.extra), self.seed)

    def compose(self, other: HeadMask) -> HeadMask:
        """Both masks at once: the elementwise product (ablation kinds, and a resample's
        seeds, must agree)."""
        if other.shape != self.shape or other.ablation != self.ablation:
            raise WorkbenchError("only masks of the same shape and ablation kind compose")
        if self.ablation == "resample" and other.seed != self.seed:
            raise WorkbenchError(f"resample masks compose only with one seed; got {self.seed} "
                                 f"and {other.seed}")
        return HeadMask(self.values * other.values, self.ablation, self.reference,
                        self.model or other.model, seed=self.seed)

    def to_record(self) -> HeadMaskFile:
        """The mask as its file's record (also what a run keeps in ``interventions``)."""
        return HeadMaskFile(format=FORMAT, model=self.model, n_layers=self.shape[0],
                            n_heads=self.shape[1], ablation=self.ablation,
                            reference=self.reference, seed=self.seed, note=self.note,
                            mask=tuple(tuple(row) for row in self.values.tolist()),
                            extra=self.extra)

    def to_json(self) -> dict[str, Any]:
        return self.to_record().to_data()

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_bytes(self.to_record().to_json())
        return path

    @classmethod
    def from_record(cls, record: HeadMaskFile, source: str = "head mask") -> HeadMask:
        """A mask from its file's record; a ``mean`` mask's reference must be a prompt set.

        Raises:
            UnknownNameError: the mean ablation's reference is not a prompt set.
        """
        mask = cls(torch.tensor(record.mask, dtype=torch.float32), record.ablation,
                   record.reference, record.model, record.note, dict(record.extra),
                   record.seed)
        mask.check_reference(source)
        return mask

    @classmethod
    def from_json(cls, data: Any, source: str = "head mask") -> HeadMask:
        """A mask from its JSON form (:meth:`to_json`), every part checked by
        :class:`~workbench.store.records.HeadMaskFile`.

        Args:
            data: the parsed JSON.
            source: what the data is, for messages (``"head mask prune.json"``).

        Raises:
            WorkbenchError: one line naming the field that is wrong: another format, a
                missing key, a size that is not a whole number >= 1, ``mask`` rows that are
                ragged or do not match the sizes, a value that is not a number in [0, 1],
                an unknown ablation, or a mean ablation whose reference is not a prompt set.
        """
        return cls.from_record(HeadMaskFile.from_data(data, what=source), source)

    @classmethod
    def load(cls, path: str | Path) -> HeadMask:
        """Read a mask file.

        Raises:
            WorkbenchError: unreadable, not a mask, or inconsistent (see :meth:`from_json`).
        """
        source = f"head mask {path}"
        data = read_bounded(path, MAX_FILE, what="head mask")
        try:
            record = HeadMaskFile.from_json(data, what=source)
        except RecordError as exc:
            if "is not valid JSON" in str(exc) or "nested too deeply" in str(exc):
                raise WorkbenchError(f"cannot read head mask {path}: {exc}") from None
            raise
        return cls.from_record(record, source)

    def check_reference(self, source: str = "head mask") -> None:
        """Raise unless a ``mean`` mask's reference is a known prompt set whose file, if it
        is one, reads as prompts (it is read during the run)."""
        if self.ablation != "mean":
            return
        if self.reference not in prompt_set_names():
            raise UnknownNameError(
                f"{source}: the mean ablation's reference {shown(self.reference)} is not a "
                f"prompt set; known prompt sets: {', '.join(prompt_set_names())}")
        try:
            check_prompt_set(self.reference)
        except WorkbenchError as exc:
            raise WorkbenchError(f"{source}: the mean ablation's reference: {exc}") from None

    def check(self, model: Model) -> None:
        """Raise unless the mask fits ``model``'s layers and query heads (and a ``mean``
        mask's reference prompt set exists): call it before a run is created."""
        self.check_shape((model.info.n_layers, model.info.n_heads), model.info.name)
        self.check_reference()

    def check_shape(self, want: tuple[int, int], name: str) -> None:
        """Raise unless the mask is ``want`` = (layers, query heads), those of model
        ``name`` (known before it loads, or read off the loaded model)."""
        if self.shape != want:
            raise WorkbenchError(
                f"head mask is {self.shape[0]} layers x {self.shape[1]} heads"
                f"{f' (made for {self.model})' if self.model else ''}; {name} "
                f"has {want[0]} x {want[1]} query heads")


def head_means(model: Model, prompts: Sequence[Prompt], *, max_batch_tokens: int = 2048
               ) -> Float[Tensor, "layer head_index d_head"]:
    """Mean of every head's output ``z`` over all real tokens of ``prompts``."""
    n_layers, n_heads, d_head = model.info.n_layers, model.info.n_heads, model.info.d_head
    sums = torch.zeros(n_layers, n_heads, d_head, dtype=torch.float64)
    count = 0
    state: dict[str, Tensor] = {}

    def make_hook(layer: int):
        def hook(z: Tensor, hook: Any) -> None:
            mask = state["mask"][:, :, None, None].to(z.dtype)  # [B, T, 1, 1]
            sums[layer] += (z * mask).sum((0, 1)).double()

        return hook

    fwd = [(hooks.z(layer), make_hook(layer)) for layer in range(n_layers)]
    with torch.inference_mode():
        for batch in progress.track(model.batches(prompts, max_tokens=max_batch_tokens),
                                    desc="head means"):
            state["mask"] = batch.attention_mask
            count += int(batch.attention_mask.sum())
            hooks.run_hooked(model.bridge, batch, fwd, stop_after=hooks.z(n_layers - 1))
    return (sums / max(count, 1)).float()


def donors(lengths: int | Sequence[int] | Int[Tensor, " batch"], seed: int
           ) -> Int[Tensor, " batch"]:
    """Which prompt of a forward batch each prompt takes a resampled head's output from:
    ``donors(lengths, seed)[b]`` is ``b``'s donor, a prompt of the same real length.

    The prompts of each length form one random cycle (their order drawn from ``seed``, the
    lengths taken from the shortest up), so no prompt is its own donor, and the same
    lengths and seed give the same donors. A batch of one length gets the cycle through the
    whole batch that ``donors(len(lengths), seed)`` gives.

    Args:
        lengths: each prompt's real length, or the number of prompts of a batch of one length.
        seed: the seed of the draw (a head mask's ``seed``).

    Raises:
        WorkbenchError: a batch of fewer than 2 prompts, or a prompt with no other of its
            length in the batch: one line naming the lengths.

    Examples:
        >>> d = donors(5, seed=0)
        >>> sorted(d.tolist()), bool((d != torch.arange(5)).all())
        ([0, 1, 2, 3, 4], True)
        >>> d = donors([5, 7, 5, 7], seed=0)
        >>> sorted(d[[0, 2]].tolist()), sorted(d[[1, 3]].tolist())
        ([0, 2], [1, 3])
    """
    sizes = [1] * lengths if isinstance(lengths, int) else [int(n) for n in lengths]
    if len(sizes) < 2:
        raise WorkbenchError(f"resample ablation takes a head's output from another prompt of "
                             f"the same forward batch; this batch holds {len(sizes)} prompt "
                             "(give at least 2 prompts, within max_batch_tokens of one batch)")
    groups: dict[int, list[int]] = {}
    for b, n in enumerate(sizes):
        groups.setdefault(n, []).append(b)
    if lone := sorted(n for n, members in groups.items() if len(members) == 1):
        counts = ", ".join(f"{n} tokens x{len(groups[n])}" for n in sorted(groups))
        which = (f"the prompt of {lone[0]} tokens has" if len(lone) == 1 else
                 f"the prompts of {', '.join(map(str, lone[:-1]))} and {lone[-1]} tokens have")
        raise WorkbenchError(
            f"resample ablation takes a head's output from another prompt of the same length "
            f"in the same forward batch; this batch holds {counts}, and {which} no other: "
            "give prompts of one length (e.g. repeated random tokens or fixed windows) or a "
            "bigger max_batch_tokens")
    generator = torch.Generator().manual_seed(seed)
    out = torch.empty(len(sizes), dtype=torch.long)
    for n in sorted(groups):
        members = torch.tensor(groups[n])
        order = members[torch.randperm(len(members), generator=generator)]
        out[order] = order.roll(-1)  # order[i] takes from order[i + 1]: a single cycle
    return out


def check_donors(mask: HeadMask | None, model: Model, prompts: Sequence[Prompt], *,
                 max_tokens: int) -> None:
    """Refuse, before a pass runs, prompts in which a ``resample`` mask finds no donor for
    some prompt of its batch (:func:`donors`), batched as they will be under the mask (in
    twos of one length: :meth:`Model.batches`); any other mask passes.

    Raises:
        WorkbenchError: the first batch refused, as :func:`donors` says it.
    """
    if mask is None or mask.ablation != "resample":
        return
    with _paired_batches(model):
        batches = model.batches(prompts, max_tokens=max_tokens)
    for batch in batches:
        donors(batch.attention_mask.sum(1), mask.seed)


def check_pairing(lengths: Sequence[int], what: str) -> None:
    """Refuse prompts among which a resample ablation finds no donor for some prompt: a
    prompt is resampled from another of its real length (:func:`donors`), and prompts of
    one length are batched together (:meth:`Model.batches` under the mask), so each length
    must be held by at least two prompts. Made on the lengths alone, before a model loads.

    Args:
        lengths: the real length of each prompt the run batches together.
        what: the prompts, for the message (``"prompt set natural"``).

    Raises:
        WorkbenchError: one line naming the lengths no other prompt has, and what to do.
    """
    counts: dict[int, int] = {}
    for n in lengths:
        counts[int(n)] = counts.get(int(n), 0) + 1
    lone = sorted(n for n, count in counts.items() if count == 1)
    if len(lengths) >= 2 and not lone:
        return
    said = (f"holds {len(lengths)} prompt" if len(lengths) < 2 else
            f"has {len(lone)} of its {len(lengths)} prompts alone at their length "
            f"({_tokens(lone)} tokens)")
    raise WorkbenchError(f"--ablation resample takes each prompt's ablated heads from another "
                         f"prompt of the same token length; {what} {said}: use --ablation "
                         "zero or mean, or a prompt set whose prompts share lengths (e.g. "
                         "repeated-random, or corpus windows)")


def _tokens(lengths: Sequence[int], shown_at_most: int = 8) -> str:
    """``41, 42 and 57``, or ``41, 42, ... and 9 more`` past ``shown_at_most``."""
    text = [str(n) for n in lengths[:shown_at_most]]
    if len(lengths) > shown_at_most:
        return f"{', '.join(text)} and {len(lengths) - shown_at_most} more"
    return text[0] if len(text) == 1 else f"{', '.join(text[:-1])} and {text[-1]}"


@dataclass
class PassMask:
    """The attention mask of the forward pass in progress, as :func:`watched` sees it, and
    the donors a resample mask drew for that pass (drawn once, read by every layer)."""

    in_pass: bool = False
    mask: Tensor | None = None
    donors: Tensor | None = None

    def lengths(self, z: Float[Tensor, "batch pos head_index d_head"]
                ) -> Int[Tensor, " batch"]:
        """Each row's real length: its count of real positions where the pass was given a
        ``[batch, pos]`` mask of ``z``'s rows and positions; otherwise (no mask, a 4-D
        visibility mask, a mask over cached positions too) every position counts."""
        mask = self.mask
        if mask is not None and mask.ndim == 2 and tuple(mask.shape) == tuple(z.shape[:2]):
            return (mask != 0).sum(1).cpu()
        return torch.full((z.shape[0],), z.shape[1], dtype=torch.long)


@contextlib.contextmanager
def watched(bridge: Any) -> Iterator[PassMask]:
    """Keep the attention mask each forward pass of ``bridge`` is given, for the length of
    the pass.

    The hooks sit on the wrapped model (``bridge.original_model``), which every path
    calls with the mask as a keyword: ``bridge(ids, attention_mask=...)``,
    ``run_with_cache`` and ``run_with_hooks`` (the last two call the bridge's ``forward``
    directly, past any hook on the bridge itself). Outside a pass, and after one that
    stopped early, the mask is ``None``.
    """
    seen = PassMask()

    def start(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        seen.in_pass, seen.mask, seen.donors = True, kwargs.get("attention_mask"), None

    def end(module: Any, args: Any, output: Any) -> None:
        seen.in_pass, seen.mask, seen.donors = False, None, None

    model = bridge.original_model
    handles = [model.register_forward_pre_hook(start, with_kwargs=True),
               model.register_forward_hook(end, always_call=True)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def mask_hooks(values: Float[Tensor, "layer head_index"],
               means: Float[Tensor, "layer head_index d_head"] | None = None, *,
               resample_seed: int | None = None, seen: PassMask | None = None
               ) -> list[tuple[str, Any]]:
    """Forward hooks on every layer's ``hook_z`` that apply ``values``.

    ``values`` may require grad (Michel et al.'s gradient importance differentiates the
    loss with respect to it). Layers whose mask is all ones get no hook at all.

    Args:
        values: the mask.
        means: a removed head becomes its mean (``mean`` ablation).
        resample_seed: a removed head becomes its output on a donor prompt of the same
            batch and length (``resample`` ablation, :func:`donors`); ``means`` must be
            ``None``.
        seen: the pass's attention mask (:func:`watched`), whose real lengths pair the
            donors; ``None``: every position of every prompt counts as real.
    """
    if means is not None and resample_seed is not None:
        raise ValueError("a mask ablates to means or resamples, not both")
    fixed = means is None and resample_seed is None
    seen = seen or PassMask()
    fwd = []
    for layer in range(values.shape[0]):
        if (means is None and not values.requires_grad
                and bool((values[layer] == 1).all())):
            continue

        def hook(z: Tensor, hook: Any, layer: int = layer) -> Tensor:
            xi = values[layer].to(z.dtype)[None, None, :, None]  # [1, 1, H, 1]
            if fixed:
                return z * xi
            if resample_seed is not None:
                donor = seen.donors
                if donor is None:
                    donor = donors(seen.lengths(z), resample_seed).to(z.device)
                    if seen.in_pass:  # drawn again in the next pass, for its own lengths
                        seen.donors = donor
                return z * xi + (1 - xi) * z[donor]  # the donor's output in this pass
            assert means is not None
            return z * xi + (1 - xi) * means[layer].to(z.dtype)[None, None]

        fwd.append((hooks.z(layer), hook))
    return fwd


@contextlib.contextmanager
def applied(model: Model, mask: HeadMask | None, *,
            means: Float[Tensor, "layer head_index d_head"] | None = None) -> Iterator[None]:
    """Apply ``mask`` to ``model`` for the duration of the block (``None``: no-op).

    For a ``mean`` mask the head means are computed on the mask's reference prompt set
    unless ``means`` is given; a ``zero`` or ``resample`` mask ignores ``means``.
    """
    if mask is None:
        yield
        return
    mask.check(model)
    seed = mask.seed if mask.ablation == "resample" else None
    if mask.ablation != "mean":
        means = None
    elif means is None:
        means = head_means(model, load_prompt_set(mask.reference, model))
    with _paired_batches(model, seed is not None), watched(model.bridge) as seen, \
            model.bridge.hooks(fwd_hooks=mask_hooks(mask.values, means, resample_seed=seed,
                                                    seen=seen)):
        yield


@contextlib.contextmanager
def _paired_batches(model: Model, on: bool = True) -> Iterator[None]:
    """:meth:`Model.batches` in twos of one length for the block (a resample's donors),
    as it was after it."""
    before = model.paired_batches
    model.paired_batches = before or on
    try:
        yield
    finally:
        model.paired_batches = before
