"""Replaying the first blocks of a reference pass: the same outputs as running them, the
kept hook points fire again, and a pass that is not its reference is refused."""

from __future__ import annotations

import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.interventions import replay
from workbench.recording import hooks

IDS = torch.tensor([[0, 5, 6, 7, 8, 9, 5, 6]])


def _logits(model, ids=IDS):
    with torch.inference_mode():
        return model.bridge(ids)


def test_replayed_blocks_give_what_running_them_gives(llama):
    seen = []
    with replay.kept(llama.bridge, [hooks.z(0)]) as prefix:
        want = _logits(llama)
    assert prefix.depth() == llama.info.n_layers
    ran = []
    fwd = [(hooks.qkv(0, "q"), lambda q, hook: ran.append(1)),  # only when block 0 runs
           (hooks.z(0), lambda z, hook: seen.append(z.clone()))]
    with replay.replayed(llama.bridge, prefix, 1), llama.bridge.hooks(fwd_hooks=fwd):
        got = _logits(llama)
    torch.testing.assert_close(got, want)
    assert ran == [] and len(seen) == 1  # block 0 did not run; its kept z was handed over
    with llama.bridge.hooks(fwd_hooks=fwd[1:]):
        _logits(llama)
    torch.testing.assert_close(seen[0], seen[1])
    assert "forward" not in vars(llama.bridge.blocks[0])  # the block is itself again


def test_a_pass_stopped_early_replays_only_the_blocks_it_finished(llama):
    """The reference stopped before the last block: asked for every block, the replay
    gives back what was kept and the last block runs, so the logits are the model's."""
    last = f"blocks.{llama.info.n_layers - 1}.hook_in"
    with replay.kept(llama.bridge) as prefix, pytest.raises(RuntimeError, match="stopped"), \
            llama.bridge.hooks(fwd_hooks=[(last, _stop)]):
        _logits(llama)
    assert prefix.depth() == llama.info.n_layers - 1
    ran = []
    with replay.replayed(llama.bridge, prefix, llama.info.n_layers), \
            llama.bridge.hooks(fwd_hooks=[(last, lambda x, hook: ran.append(1))]):
        got = _logits(llama)
    torch.testing.assert_close(got, _logits(llama))
    assert ran == [1]


def _stop(x, hook):
    raise RuntimeError("stopped")


def test_copies_are_replayed_copy_major(llama):
    with replay.kept(llama.bridge) as prefix:
        one = _logits(llama)
    with replay.replayed(llama.bridge, prefix, 2, copies=3):
        three = _logits(llama, IDS.repeat(3, 1))
    torch.testing.assert_close(three, one.repeat(3, 1, 1))


def test_a_pass_that_is_not_its_reference_is_refused(llama):
    with replay.kept(llama.bridge) as prefix:
        _logits(llama)
    with pytest.raises(WorkbenchError, match="inputs"), replay.replayed(llama.bridge, prefix, 1):
        _logits(llama, IDS[:, :5])
    with pytest.raises(WorkbenchError, match="more passes"), \
            replay.replayed(llama.bridge, prefix, 1):
        _logits(llama)
        _logits(llama)
