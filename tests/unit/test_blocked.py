"""Blocked attention on the tiny Llama: no quadratic allocation, the block size, refusals.

The per-family equality with eager attention is in ``tests/architectures/test_blocked.py``.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from workbench.core.errors import WorkbenchError
from workbench.models import blocked as blocked_attention
from workbench.recording import hooks

HANG = 300  # seconds: a bound on a hang, never on a speed


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
    # the default budget, 32 MiB: 113 rows fit (no block above glibc's mmap threshold)
    assert blocked_attention.rows_per_block(1, 9, 8192) == 64


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


def test_two_threads_blocking_one_model_take_turns_and_leave_it_as_it_was(llama):
    config = llama.bridge.original_model.config
    first_in, release, second_in = threading.Event(), threading.Event(), threading.Event()

    def first():
        with blocked_attention.blocked(llama):
            first_in.set()
            assert release.wait(HANG)

    def second():
        assert first_in.wait(HANG)
        with blocked_attention.blocked(llama):
            second_in.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert first_in.wait(HANG)
    # the second waits while the first holds the model (else it would save the first's
    # implementation as the original, and put it back when it ends, after the first)
    assert not second_in.wait(0.3)
    release.set()
    for thread in threads:
        thread.join(HANG)
    assert second_in.is_set() and config._attn_implementation == "eager"


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


def test_a_head_mask_at_hook_z_applies_in_a_blocked_pass(llama):
    """hook_z still fires, so masking a head of layer 0 moves layer 1's patterns alike."""
    import numpy as np

    from workbench.inputs.prompts import Prompt
    from workbench.interventions.masks import HeadMask, applied
    from workbench.recording.reductions import reduce_patterns
    from workbench.scores import metrics

    prompts = [Prompt(text="the cat sat on the mat and the dog sat on the rug")]
    fns = metrics.reductions("entropy", "first_token", "previous_token")
    plain = reduce_patterns(llama, prompts, fns, attention="blocked")
    with applied(llama, HeadMask.for_model(llama).without([(0, 1), (0, 2)])):
        dense = reduce_patterns(llama, prompts, fns, attention="dense")
        got = reduce_patterns(llama, prompts, fns, attention="blocked", block=3)
    np.testing.assert_allclose(got.score, dense.score, atol=1e-6)
    moved = (dense.layer == 1) & ((dense.score - plain.score).abs() > 1e-4)
    assert moved.any()  # the mask changed what layer 1 sees


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_hands_over_float32_softmax_weights(llama_hf, tokenizer, dtype):
    """In bfloat16 and float16 the softmax stays float32 (as the bridge computes it), and
    what a consumer reads is that float32 pattern, not its rounding to the model's dtype."""
    import copy

    from tests import tiny
    from workbench.models.base import DTYPES

    model = tiny.wrap(copy.deepcopy(llama_hf).to(DTYPES[dtype]), tokenizer, f"tiny-{dtype}",
                      dtype=dtype)
    ids = torch.randint(6, 300, (1, 20), generator=torch.Generator().manual_seed(5))
    dense = hooks.caching_hooks([hooks.pattern(1)])
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=dense[1]):
        model.bridge(ids, return_type=None)
    blocks = []
    with torch.inference_mode(), blocked_attention.blocked(model, blocks.append, block=8):
        model.bridge(ids, return_type=None)
    assert {b.weights.dtype for b in blocks} == {torch.float32}
    rebuilt = torch.zeros(1, model.info.n_heads, 20, 20)
    for b in (b for b in blocks if b.layer == 1):
        rebuilt[..., b.q0:b.q1, b.k0:b.k1] = b.weights
    want = dense[0][hooks.pattern(1)]
    assert want.dtype == DTYPES[dtype]  # the dense pattern is rounded to the model's dtype
    eps = torch.finfo(DTYPES[dtype]).eps
    torch.testing.assert_close(rebuilt, want.float(), atol=4 * eps, rtol=0)
