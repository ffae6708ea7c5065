"""Quiet norms on every family: a pass's output is bit for bit the bridge's own.

Reference: the same pass with an observing hook (one that returns nothing) on every
``hook_scale`` and ``hook_normalized``, which makes every norm run the bridge's own forward
(its statistics, then the wrapped module's output). Without those hooks the quiet norms
skip the statistics; the logits must be identical, not merely close. A hook that edits a
scale must still take effect.
"""

from __future__ import annotations

import pytest
import torch

from tests.architectures.families import BUILDERS
from workbench.models import quiet_norms
from workbench.models.adapters import adapter_for

FAMILIES = [f for f, (cls, _) in BUILDERS.items() if not adapter_for(cls).unsupported]


def _norm_points(model) -> list[str]:
    return [name for name in model.bridge.hook_dict
            if name.endswith((".hook_scale", ".hook_normalized"))]


def _logits(model, ids, fwd_hooks=()) -> torch.Tensor:
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=list(fwd_hooks)):
        return model.bridge(ids)


def _quieted(model) -> list:
    return [module for module in model.bridge.modules()
            if getattr(vars(module).get("forward"), "func", None) is quiet_norms._forward]


@pytest.mark.parametrize("family", FAMILIES)
def test_quiet_norms_give_the_bridges_own_output(families, family):
    model = families.model(family)
    ids = torch.randint(6, len(families.tokenizer(family)), (2, 11),
                        generator=torch.Generator().manual_seed(0))
    fired: set[str] = set()
    watch = [(name, lambda t, hook: fired.add(hook.name)) for name in _norm_points(model)]
    quiet, watched = _logits(model, ids), _logits(model, ids, watch)
    assert torch.equal(quiet, watched)
    # watched, every quiet norm ran the bridge's own path: its statistics reached the hook
    assert {norm.hook_scale.name for norm in _quieted(model)} <= fired


@pytest.mark.parametrize("family", ["llama", "gemma-3", "bert"])
def test_a_quiet_norm_still_takes_a_scale_edit(families, family):
    model = families.model(family)
    assert _quieted(model), "the family's norms are on the native path: they should be quiet"
    ids = torch.randint(6, len(families.tokenizer(family)), (1, 9),
                        generator=torch.Generator().manual_seed(1))
    edit = [(f"blocks.{model.info.n_layers - 1}.ln2.hook_scale", lambda t, hook: t * 2)]
    with pytest.warns(UserWarning):  # the bridge says an edit leaves its native path
        edited = _logits(model, ids, edit)
    assert not torch.allclose(edited, _logits(model, ids))
