"""Ablating chosen heads, and the control an ablation needs: random heads of the same layers.

An ablation says something only against a control: removing *some* heads from a layer
may hurt whatever the heads were. :func:`random_same_layer` draws, for each chosen head,
another head of the same layer (never a chosen head, nor one to leave alone), so that the
control removes as many heads from the same depths. :func:`ablated` removes a list of
heads for the duration of a block, by zero or mean ablation of their outputs
(:mod:`workbench.interventions.masks`).

Examples:
    >>> rng = random.Random(0)
    >>> random_same_layer([(0, 1), (0, 3)], avoid=[(1, 2)], n_heads=4, rng=rng)
    [(0, 2), (0, 0)]
    >>> with ablated(model, [(0, 1)], kind="mean"):           # doctest: +SKIP
    ...     logits = model.logits(ids)
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable, Iterator, Sequence

from jaxtyping import Float
from torch import Tensor

from workbench.core.errors import WorkbenchError
from workbench.interventions.masks import Ablation, HeadMask, applied
from workbench.models.base import Model

Head = tuple[int, int]


def random_same_layer(chosen: Sequence[Head], avoid: Iterable[Head], n_heads: int,
                      rng: random.Random) -> list[Head]:
    """One random head from each chosen head's layer, never a chosen or avoided head, and
    never the same head twice.

    Args:
        chosen: the ``(layer, head)`` pairs an ablation removes.
        avoid: heads the control must not remove either (e.g. the heads it measures).
        n_heads: query heads per layer.
        rng: the source of the draw (seed it for a reproducible control).

    Returns:
        As many heads as ``chosen``, in the same order of layers.

    Raises:
        WorkbenchError: a layer has no head left to draw.
    """
    skip = set(chosen) | set(avoid)
    picked: list[Head] = []
    for layer, _ in chosen:
        options = [(layer, h) for h in range(n_heads)
                   if (layer, h) not in skip and (layer, h) not in picked]
        if not options:
            raise WorkbenchError(f"layer {layer} has no head left for a random same-layer "
                                 f"draw ({n_heads} heads; chosen or avoided: "
                                 f"{sorted(h for h in skip if h[0] == layer)})")
        picked.append(rng.choice(options))
    return picked


@contextlib.contextmanager
def ablated(model: Model, heads: Iterable[Head], *, kind: Ablation = "zero",
            means: Float[Tensor, "layer head_index d_head"] | None = None) -> Iterator[None]:
    """Run the block with ``heads`` removed (no heads: nothing changes).

    Args:
        model: the model.
        heads: ``(layer, head)`` pairs to remove.
        kind: ``zero`` sets their output ``z`` to 0; ``mean`` replaces it by its mean.
        means: for ``mean``: the head means (:func:`~workbench.interventions.masks.head_means`);
            by default computed on the ``natural`` prompt set.
    """
    heads = list(heads)
    mask = HeadMask.for_model(model, ablation=kind).without(heads) if heads else None
    with applied(model, mask, means=means):
        yield
