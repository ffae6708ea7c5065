"""Replaying the blocks below an intervention instead of running them again.

An intervention at layer ``l`` (a head removed, a path patched into a head's input) leaves
every block below ``l`` computing exactly what it computed without it. When many
interventions are measured on the same inputs, the blocks below the lowest one need to run
once: :func:`kept` records each block's output during one reference pass (or several, one
per batch), and :func:`replayed` makes the first blocks return those outputs instead of
running. A replayed block's hook points do not fire, except those named when the outputs
were kept: their activations are kept too and handed to the hooks again, in the order they
fired, so a hook that *reads* a replayed layer (the sources of a path patch) still sees it.
A hook that *changes* a replayed layer would be ignored: replay only the blocks the
intervention does not touch.

Blocks return their hidden states bare or in a tuple with other per-row tensors (some
families return their attention weights) or ``None``; kept outputs stop at the first block
that returns anything else, or that did not finish (a pass stopped early), and only the
blocks kept can be replayed.

Examples:
    >>> with kept(model.bridge) as prefix:                          # doctest: +SKIP
    ...     reference = run(batch)
    >>> with replayed(model.bridge, prefix, upto=layer):            # doctest: +SKIP
    ...     changed = run(batch)            # blocks 0 .. layer-1 are not run again
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from workbench.core.errors import WorkbenchError

Output = Tensor | tuple[Tensor | None, ...]
"""A block's output as it returned it."""


@dataclass
class Pass:
    """One reference forward pass: what its first blocks returned and, per block, the kept
    hook activations in the order they fired."""

    outputs: list[Output] = field(default_factory=list)
    activations: list[list[tuple[str, Tensor]]] = field(default_factory=list)


@dataclass
class Prefix:
    """The reference passes, in the order they ran."""

    passes: list[Pass] = field(default_factory=list)

    def depth(self) -> int:
        """How many first blocks every pass can replay."""
        return min((len(p.outputs) for p in self.passes), default=0)


def _blocks(bridge: Any) -> list[Any]:
    return list(getattr(bridge, "blocks", []))


@contextmanager
def kept(bridge: Any, hook_names: Sequence[str] = ()) -> Iterator[Prefix]:
    """Keep every block's output (and the activations at ``hook_names``) while the block runs.

    Args:
        bridge: the model's bridge.
        hook_names: hook points inside the blocks whose activations a later replay must
            hand to the hooks on them again.

    Yields:
        The :class:`Prefix`, filled in as the passes run (each block's output cloned: a
        later block may change its input in place).
    """
    prefix = Prefix()
    blocks = _blocks(bridge)
    block_of = {name: int(name.split(".")[1]) for name in hook_names}
    pending: dict[int, list[tuple[str, Tensor]]] = {}

    def keep_output(index: int) -> Callable[..., None]:
        def hook(module: Any, args: Any, out: Any) -> None:
            if index == 0:
                prefix.passes.append(Pass())
                for stale in [i for i in pending if i != 0]:  # of a pass stopped early
                    del pending[stale]
            current = prefix.passes[-1] if prefix.passes else None
            if current is None or len(current.outputs) != index or not _replayable(out):
                return  # a block that cannot be replayed ends this pass's prefix
            current.outputs.append(_map(out, Tensor.clone))
            current.activations.append(pending.pop(index, []))
        return hook

    def keep_activation(name: str) -> Callable[[Tensor, Any], None]:
        def hook(tensor: Tensor, hook: Any) -> None:
            pending.setdefault(block_of[name], []).append((name, tensor.detach().clone()))
        return hook

    handles = [block.register_forward_hook(keep_output(i)) for i, block in enumerate(blocks)]
    try:
        with bridge.hooks(fwd_hooks=[(name, keep_activation(name)) for name in hook_names]):
            yield prefix
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def replayed(bridge: Any, prefix: Prefix, upto: int, *, copies: int = 1) -> Iterator[None]:
    """Blocks ``0 .. upto-1`` return their kept outputs instead of running (only as many as
    :meth:`Prefix.depth` kept: the blocks after them run, which is exact too).

    The passes run inside the block must be the reference passes again, in the same order
    and on the same inputs, each repeated ``copies`` times along the batch (copy-major);
    the hooks on the kept hook points get the kept activations, repeated the same way.

    Raises:
        WorkbenchError: a pass does not match its reference pass (more passes, or other
            shapes).
    """
    upto = min(upto, prefix.depth())
    blocks = _blocks(bridge)[:upto]
    names = {name for p in prefix.passes for acts in p.activations[:upto] for name, _ in acts}
    hook_points = {name: _hook_point(bridge, name) for name in names}
    count = [-1]

    def repeated(t: Tensor) -> Tensor:
        return t.repeat(copies, *([1] * (t.dim() - 1)))

    def replay(index: int) -> Callable[..., Output]:
        def forward(*args: Any, **kwargs: Any) -> Output:
            if index == 0:
                count[0] += 1
            if count[0] >= len(prefix.passes):
                raise WorkbenchError(f"replay: more passes than the {len(prefix.passes)} kept")
            reference = prefix.passes[count[0]]
            out = _map(reference.outputs[index], repeated)
            hidden = args[0] if args and isinstance(args[0], Tensor) else None
            if index == 0 and hidden is not None and hidden.shape[:2] != _first(out).shape[:2]:
                raise WorkbenchError(f"replay: pass {count[0]} has inputs {tuple(hidden.shape)}, "
                                     f"its reference {tuple(_first(out).shape)}")
            for name, tensor in reference.activations[index]:
                hook_points[name](repeated(tensor))  # the hooks on it fire; result unused
            return out
        return forward

    for i, block in enumerate(blocks):
        # on the block itself (the bridge's own setattr would pass it to the wrapped HF
        # module): an instance attribute, found before the class's forward
        object.__setattr__(block, "forward", replay(i))
    try:
        yield
    finally:
        for block in blocks:
            object.__delattr__(block, "forward")


def _hook_point(bridge: Any, name: str) -> Any:
    """The hook point at ``name`` (aliases such as ``hook_resid_pre`` are attributes)."""
    point = bridge
    for part in name.split("."):
        point = getattr(point, part)
    return point


def _first(output: Output) -> Tensor:
    return output[0] if isinstance(output, tuple) else output  # type: ignore[return-value]


def _replayable(output: Any) -> bool:
    parts = output if isinstance(output, tuple) else (output,)
    if not parts or not isinstance(parts[0], Tensor) or parts[0].dim() == 0:
        return False
    rows = parts[0].shape[0]
    return all(p is None or (isinstance(p, Tensor) and p.dim() > 0 and p.shape[0] == rows)
               for p in parts)


def _map(output: Output, fn: Callable[[Tensor], Tensor]) -> Output:
    if isinstance(output, Tensor):
        return fn(output)
    return tuple(None if p is None else fn(p) for p in output)
