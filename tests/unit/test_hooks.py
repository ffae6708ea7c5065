"""Capturing activations: the same tensors as the bridge's own ``run_with_cache``, a pass
stopped early that never reaches the later blocks, copies that a later in-place change
cannot reach, and unknown hook names refused with the close ones."""

from __future__ import annotations

import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.recording import hooks

PROMPTS = [Prompt(text="the cat sat on the mat and the dog sat on the rug"),
           Prompt(text="bread is made from flour")]  # two lengths: the batch is padded


def _names(model):
    n = model.info.n_layers
    return [hooks.resid(0, n), hooks.pattern(0), hooks.z(0), hooks.norm_scale(0),
            hooks.mlp_out(0), hooks.scores(n - 1), hooks.resid(n, n)]


@pytest.mark.parametrize("which", ["llama", "bert"])
def test_captured_tensors_are_run_with_cache(which, request):
    model = request.getfixturevalue(which)
    [batch] = model.batches(PROMPTS)
    names = _names(model)
    with torch.no_grad():
        kept = hooks.capture(model, batch, names)
        _, cache = model.bridge.run_with_cache(batch.input_ids, names_filter=names,
                                               **batch.forward_kwargs())
    assert list(kept) == names
    for name in names:
        assert kept[name].dtype == cache[name].dtype and torch.equal(kept[name], cache[name])


def _later_block_spy(model, ran):
    """A hook on the second block's input, outside the capture, that records each call."""
    return model.bridge.hooks(fwd_hooks=[(hooks.resid(1, model.info.n_layers),
                                          lambda tensor, hook: ran.append(1))])


def test_a_pass_stopped_early_keeps_the_same_tensors_and_skips_later_blocks(llama):
    [batch] = llama.batches(PROMPTS)
    names = [hooks.pattern(0), hooks.z(0)]
    ran: list[int] = []
    with torch.no_grad(), _later_block_spy(llama, ran):
        early = hooks.capture(llama, batch, names)
        assert ran == []  # stopped once hook_z of block 0 fired
        _, cache = llama.bridge.run_with_cache(batch.input_ids, names_filter=names,
                                               **batch.forward_kwargs())
        assert ran == [1]  # the spy does see a full pass
        at_pattern = hooks.capture(llama, batch, names, stop_after=hooks.pattern(0))
        assert ran == [1]
    for name in names:
        assert torch.equal(early[name], cache[name])
    # hook_z fires after the pattern: a pass stopped at the pattern never reaches it
    assert list(at_pattern) == [hooks.pattern(0)]
    assert torch.equal(at_pattern[hooks.pattern(0)], cache[hooks.pattern(0)])


def test_kept_tensors_are_copies_and_detached_unless_asked(llama):
    [batch] = llama.batches(PROMPTS)
    name = hooks.z(0)
    # the bridge hands ln1's output to the attention as it is: zeroing the attention's
    # input in place zeroes the very tensor ln1.hook_out saw
    kept, keep = hooks.caching_hooks(["blocks.0.ln1.hook_out"])
    zero = [(hooks.attn_in(0), lambda x, hook: x.zero_())]
    with torch.no_grad(), llama.bridge.hooks(fwd_hooks=[*keep, *zero]):
        llama.bridge(batch.input_ids, return_type=None, **batch.forward_kwargs())
    assert kept["blocks.0.ln1.hook_out"].abs().max() > 0
    with torch.enable_grad():
        assert not hooks.capture(llama, batch, [name])[name].requires_grad
        attached = hooks.capture(llama, batch, [name], detach=False)[name]
        attached.sum().backward()
    assert attached.requires_grad and llama.bridge.blocks[0].attn.v.weight.grad is not None
    llama.bridge.zero_grad(set_to_none=True)


def test_unknown_hook_names_are_refused_with_the_close_ones(llama):
    [batch] = llama.batches(PROMPTS)
    with pytest.raises(WorkbenchError) as err:
        hooks.capture(llama, batch, ["blocks.0.attn.hook_patern"])
    assert str(err.value) == ("tiny-llama has no hook point 'blocks.0.attn.hook_patern' (did you "
                              "mean 'blocks.0.attn.hook_pattern' or 'blocks.1.attn.hook_pattern'?)")
    with pytest.raises(WorkbenchError, match=r"no hook point 'blocks\.9\.hook_z'"):
        hooks.capture(llama, batch, [hooks.z(0)], stop_after="blocks.9.hook_z")
