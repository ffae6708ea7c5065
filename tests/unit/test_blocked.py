"""Blocked attention on the tiny Llama: no quadratic allocation, the block size, refusals.

The per-family equality with eager attention is in ``tests/architectures/test_blocked.py``.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from workbench.core.errors import WorkbenchError
from workbench.models import blocked as blocked_attention
from workbench.recording import hooks


class LargestAllocation(TorchDispatchMode):
    """Records the largest storage (in elements) any operation's result lives in."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                storage = value.untyped_storage().nbytes() // max(1, value.element_size())
                self.largest = max(self.largest, storage)
        return out


def _pass(model, ids) -> None:
    stop = [(hooks.attn_out(model.info.n_layers - 1), _stop)]
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=stop), \
            contextlib.suppress(StopIteration):
        model.bridge(ids, return_type=None)


def _stop(tensor, hook):
    raise StopIteration  # the unembedding is not attention's


def test_a_blocked_pass_allocates_nothing_of_t_by_t(llama):
    n = 512  # heads x T x T = 1M elements; T x T (a mask) = 262k; anything else is < 33k
    ids = torch.randint(6, 300, (1, n), generator=torch.Generator().manual_seed(0))
    dense = LargestAllocation()
    with dense:
        _pass(llama, ids)
    assert dense.largest >= llama.info.n_heads * n * n  # the tracer sees the eager scores
    traced = LargestAllocation()
    with traced, blocked_attention.blocked(llama, lambda block: None, block=16):
        _pass(llama, ids)
    assert traced.largest < n * n  # no [head, T, T] scores, and no [T, T] mask either
    assert traced.largest <= 2 * llama.info.n_heads * 16 * n  # about one block of scores


def test_rows_per_block_fit_the_budget_as_a_power_of_two():
    assert blocked_attention.rows_per_block(1, 9, 8192, 64 << 20) == 128  # 227 rows fit
    assert blocked_attention.rows_per_block(2, 4, 100, 64 << 20) == 1 << 14  # 20,971 fit
    assert blocked_attention.rows_per_block(8, 32, 1 << 20, 1) == 1


def test_a_hook_on_the_pattern_is_refused_in_a_blocked_pass(llama):
    ids = torch.tensor([[0, 7, 9, 11]])
    with torch.inference_mode(), blocked_attention.blocked(llama), \
            llama.bridge.hooks(fwd_hooks=[(hooks.pattern(0), lambda t, hook: None)]), \
            pytest.raises(WorkbenchError, match="hook_pattern needs the whole pattern"):
        llama.bridge(ids, return_type=None)
    with torch.inference_mode():  # the model's own attention is back after the block
        kept, fwd = hooks.caching_hooks([hooks.pattern(0)])
        with llama.bridge.hooks(fwd_hooks=fwd):
            llama.bridge(ids, return_type=None)
    assert kept[hooks.pattern(0)].shape == (1, llama.info.n_heads, 4, 4)
    assert llama.bridge.original_model.config._attn_implementation == "eager"


def test_a_bad_block_is_refused(llama):
    with pytest.raises(WorkbenchError, match="positive number"), \
            blocked_attention.blocked(llama, block=0):
        pass


def test_a_cached_pass_equals_the_eager_one(llama):
    """Queries after a key-value cache (the streaming measurements' chunks) block too."""
    from transformers import DynamicCache

    from workbench.scores.streaming import cache_reaches_attention

    ids = torch.randint(6, 300, (1, 30), generator=torch.Generator().manual_seed(3))

    def chunked():
        cache, out = DynamicCache(), []
        for start in (0, 12, 25):
            part = ids[:, start:{0: 12, 12: 25, 25: 30}[start]]
            out.append(llama.bridge(part, past_key_values=cache,
                                    position_ids=torch.arange(start, start + part.shape[1])[None]))
        return torch.cat(out, dim=1)

    with torch.inference_mode(), cache_reaches_attention(llama):
        want = llama.bridge(ids)
        with blocked_attention.blocked(llama, block=4):
            got = chunked()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
