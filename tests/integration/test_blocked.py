"""Blocked attention on the bundled models: every layer's output is the bridge's eager
output within 1e-6 (float32), each layer fed the eager pass's input, in a right-padded
batch whose length is not a multiple of the block."""

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
        torch.testing.assert_close(got[name_][real], want[real], atol=1e-6, rtol=0,
                                   msg=name_)
