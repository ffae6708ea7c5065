"""The family x experiment matrix: which experiment works on which model family, and why not.

Derived, never written by hand: the families and what each supports come from the adapters
registry (:mod:`workbench.models.adapters`), the experiments and what they require from the
experiment registry. ``workbench models --families`` prints it; ``tests/architectures``
checks every cell against a real run on a tiny random model of the family. The bundled
models (:data:`workbench.models.zoo.MODELS`) are the rows on real pretrained weights
(:func:`real_weights_matrix`), kept apart: each is its family's row on one real model,
which ``tests/integration`` runs.

Examples:
    >>> cells = family_matrix()                                       # doctest: +SKIP
    >>> next(c for c in cells if c.family == "bert" and c.experiment == "induction-heads")
    Cell(family='bert', experiment='induction-heads', works=False, reason='...')  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.harness.experiment import Experiment, all_experiments
from workbench.models import zoo
from workbench.models.adapters import FAMILIES, Adapter, adapter_for


@dataclass(frozen=True)
class Cell:
    """One family on one experiment: ``works`` (with a ``reason`` naming any step left out
    of the run) or not (``reason`` says why it is refused)."""

    family: str
    experiment: str
    works: bool
    reason: str = ""

    @property
    def label(self) -> str:
        if not self.works:
            return f"n/a: {self.reason}"
        return f"works ({self.reason})" if self.reason else "works"


def _sinks_steps(adapter: Adapter) -> str | None:
    if not adapter.causal:
        return "no BOS or streaming parts: an encoder"
    if adapter.positions == "alibi":
        return "no streaming part: ALiBi is built from a 2-D padding mask"
    if adapter.local_attention:
        return ("no streaming part: one 4-D mask would replace the sliding layers' own "
                "windows; window-edge part instead")
    return None


def _pruning_steps(adapter: Adapter) -> str | None:
    why = adapter.removal_reason()
    return f"removal step skipped: {why}" if why else None


def _linear_scores(adapter: Adapter) -> str | None:
    """Why attention scores are not a bilinear form of the normed residual stream."""
    if adapter.norm != "pre":
        return f"needs a pre-norm block; {adapter.family} normalizes after its sublayers"
    if adapter.positions in ("alibi", "relative"):
        return f"{adapter.positions} position biases are added to the scores"
    if adapter.qk_norm == "full_width":
        return ("queries and keys are normalized over every head together, so one head's "
                "scores are not linear in its own projection")
    if adapter.softcap:
        return "the scores are soft-capped (tanh), so not linear"
    return adapter.score_hooks


def _linear_logits(adapter: Adapter) -> str | None:
    """Why a logit difference is not a sum of the residual stream's parts' direct effects."""
    if adapter.logit_softcap:
        return "the logits are soft-capped (tanh), so a logit difference is not linear"
    return None


def _separate_heads(adapter: Adapter) -> str | None:
    """Why the heads' inputs are not separate receivers of the residual stream."""
    if adapter.qk_norm == "full_width":
        return ("queries and keys are normalized over every head together, so one head's "
                "query input is not its own receiver")
    if adapter.norm != "pre":
        return f"needs a pre-norm block; {adapter.family} normalizes after its sublayers"
    return None


NEEDS: dict[str, Callable[[Adapter], str | None]] = {
    "circuit": _separate_heads,
    "qk-attribution": _linear_scores,
    "ioi": _linear_logits,
    "logit-lens": _linear_logits,
}
"""Experiments that refuse some families for what the family is (beyond ``requires``):
why, from the adapter's facts."""

STEPS: dict[str, Callable[[Adapter], str | None]] = {
    "head-pruning": _pruning_steps,
    "attention-sinks": _sinks_steps,
}
"""Experiments with a step that depends on the family: the step left out, and why."""


def cell(adapter: Adapter, exp: Experiment) -> Cell:
    """Whether ``exp`` runs on ``adapter``'s family, from what each declares."""
    if adapter.unsupported:
        return Cell(adapter.family, exp.name, False, adapter.unsupported)
    if exp.requires != "any" and not adapter.causal:
        return Cell(adapter.family, exp.name, False,
                    f"needs a causal LM; {adapter.family} is a bidirectional encoder")
    need = NEEDS.get(exp.name)
    if need is not None and (why := need(adapter)):
        return Cell(adapter.family, exp.name, False, why)
    step = STEPS.get(exp.name)
    return Cell(adapter.family, exp.name, True, (step(adapter) if step else None) or "")


def family_matrix() -> list[Cell]:
    """Every registered family on every experiment that takes a model (the others train
    their own models), families and experiments in name order.

    Returns:
        One :class:`Cell` per (family, experiment).
    """
    experiments = [exp for exp in all_experiments() if exp.needs_model]
    return [cell(adapter, exp) for _, adapter in FAMILIES.items() for exp in experiments]


def real_weights_matrix() -> list[tuple[str, Cell]]:
    """Every bundled model (real pretrained weights) on every experiment that takes a
    model: its family's cells, models and experiments in name order.

    Returns:
        ``(bundled model name, the cell of its family)`` per (model, experiment).
    """
    experiments = [exp for exp in all_experiments() if exp.needs_model]
    return [(name, cell(adapter_for(spec.architecture), exp))
            for name, spec in zoo.MODELS.items() for exp in experiments]
