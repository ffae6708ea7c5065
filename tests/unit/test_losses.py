"""Cross-entropy of a large vocabulary, against float64.

Reference: ``F.cross_entropy`` of the same logits in float64, on a vocabulary of Gemma
3's size (262,144 entries) with logits as large as its (about 200 at most).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from workbench.scores.losses import final_nll, next_token_nll

D_MODEL, D_VOCAB = 64, 262_144


def _unembedding() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w_u = torch.randn(D_MODEL, D_VOCAB, generator=g) * 2.0
    normed = torch.randn(12, D_MODEL, generator=g) * 3.0
    targets = torch.randint(0, D_VOCAB, (12,), generator=g)
    return w_u, normed, targets


def test_final_nll_is_the_float64_cross_entropy():
    w_u, normed, targets = _unembedding()
    model = SimpleNamespace(bridge=SimpleNamespace(W_U=w_u, b_U=torch.zeros(D_VOCAB)))
    exact = F.cross_entropy(normed.double() @ w_u.double(), targets, reduction="none")
    assert (normed @ w_u).abs().max() > 100  # logits as large as Gemma 3's
    got = final_nll(model, normed, targets)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), exact, atol=1e-4, rtol=1e-6)


def test_next_token_nll_is_the_float64_cross_entropy():
    w_u, normed, targets = _unembedding()
    logits = (normed @ w_u).view(2, 6, D_VOCAB)  # [batch, pos, d_vocab]
    ids = targets.view(2, 6)
    exact = F.cross_entropy((normed.double() @ w_u.double()).view(2, 6, -1)[:, :-1]
                            .reshape(-1, D_VOCAB), ids[:, 1:].reshape(-1), reduction="none")
    got = next_token_nll(logits, ids)
    assert got.shape == (2, 5)
    torch.testing.assert_close(got.double().reshape(-1), exact, atol=1e-4, rtol=1e-6)
