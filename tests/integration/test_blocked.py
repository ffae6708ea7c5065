"""Blocked attention on the bundled models: every layer's output is the bridge's eager
output within 1e-6 of its own scale (float32), each layer fed the eager pass's input, in a
right-padded batch whose length is not a multiple of the block.

The scale: smollm2's attention outputs reach 190, where one float32 step is 1.5e-5, so a
sum taken in another order (the blocks', or another CPU's kernels) can differ by a few
steps; 1e-6 absolute held only where the kernels happened to add in the eager order. The
tolerance is 1e-6 times the largest magnitude of the eager output (at least 1e-6)."""

from __future__ import annotations

import pytest
import torch

from tests.architectures.test_blocked import _batch, _outputs
from workbench.models import blocked as blocked_attention


@pytest.mark.parametrize("name", ["smollm2", "minilm"])
@pytest.mark.parametrize("block", [64, None])
def test_blocked_layer_outputs_equal_eager_on_the_bundled_models(request, name, block):
    model = request.getfixturevalue(name)
    assert blocked_attention.support(model) is None
    ids, mask = _batch(300, model.info.d_vocab, seed=4)
    ids[:, 0] = model.tokenizer.cls_token_id if not model.info.causal else \
        model.info.bos_token_id
    eager = _outputs(model, ids, mask)
    with blocked_attention.blocked(model, block=block):
        got = _outputs(model, ids, mask, inputs=eager)
    real = mask.bool()
    for name_, want in eager.items():
        scale = max(1.0, want[real].abs().max().item())
        torch.testing.assert_close(got[name_][real], want[real], atol=1e-6 * scale, rtol=0,
                                   msg=name_)
