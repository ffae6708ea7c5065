"""The ioi experiment's upstream path patches (into the S-inhibition heads' keys and values,
the induction heads' keys) on the tiny Llama: the sender's own clean output changes nothing,
one sender -> receiver patch equals hooks written here by hand, and the classes follow the
stated criteria on a hand-built table."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.ioi.measure import (
    groups_of,
    path_changes,
    upstream_class_rows,
    upstream_receivers,
    upstream_senders,
)
from tests import tiny
from workbench.inputs.ioi import ioi_prompts

WORDS = {"names": ["and", "dog", "on", "sat", "the"], "places": ["dog"], "objects": ["sat"]}
CFG = SimpleNamespace(n_boot=50, seed=0, min_effect=0.1, min_attention=0.1, n_receivers=2)
SHARPER = 6.0
BEHAVIOUR = pd.DataFrame([{"scope": "all", "above_chance": True}])


@pytest.fixture(scope="module")
def llama(tokenizer):
    """The tiny Llama with its queries and keys scaled up: sharper patterns, so that a
    sender's change through a key moves the logit difference well above float32 noise."""
    hf = tiny.tiny_llama_hf(len(tokenizer))
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight *= SHARPER
            layer.self_attn.k_proj.weight *= SHARPER
    return tiny.wrap(hf, tokenizer, "tiny-llama-sharp")


@pytest.fixture(scope="module")
def groups(llama):
    return groups_of(ioi_prompts(llama, 6, templates=[0], seed=3, **WORDS))


@pytest.mark.parametrize("paths", [("k",), ("v",), ("k", "v")])
def test_the_senders_own_clean_output_changes_nothing(llama, groups, paths):
    senders = [(0, h) for h in range(4)]
    clean, patched = path_changes(llama, groups, senders, [(1, 0), (1, 3)], paths, CFG,
                                  source="clean")
    assert patched.shape == (6, 4)
    np.testing.assert_allclose(patched, clean[:, None].repeat(4, 1), rtol=0, atol=1e-7)
    # the corrupted output does change it
    _, corrupted = path_changes(llama, groups, senders, [(1, 0), (1, 3)], paths, CFG)
    assert np.abs(corrupted - clean[:, None]).max() > 1e-5


def _by_hand(llama, ids: torch.Tensor, twin: torch.Tensor, sender, receiver, path, ends,
             contrast):
    """The logit difference with ``sender``'s corrupted output added in place of its clean
    one to only ``receiver``'s key or value input, the receiver layer's RMSNorm scale taken
    from the clean pass: hooks written out here, not the library's."""
    bridge, (sl, sh), (rl, rh) = llama.bridge, sender, receiver
    group = rh // (llama.info.n_heads // llama.info.n_kv_heads)
    seen: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(x, hook):
            seen[name] = x.detach().clone()
        return hook

    with torch.no_grad():
        with bridge.hooks(fwd_hooks=[(f"blocks.{sl}.attn.hook_z", keep("z_other"))]):
            bridge(twin)
        norm = llama.bridge.blocks[rl].ln1._original_component
        w_in = {"k": bridge.W_K, "v": bridge.W_V}[path][rl, group]

        def patch(x, hook):
            delta = (seen["z_other"] - seen["z"])[:, :, sh] @ bridge.W_O[sl, sh]
            resid = seen["resid"]
            rms = torch.sqrt(resid.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
            x = x.clone()
            x[:, :, group] += (norm.weight * delta / rms) @ w_in
            return x

        with bridge.hooks(fwd_hooks=[(f"blocks.{sl}.attn.hook_z", keep("z")),
                                     (f"blocks.{rl}.hook_resid_pre", keep("resid")),
                                     (f"blocks.{rl}.attn.hook_{path}", patch)]):
            logits = bridge(ids)
    rows = torch.arange(len(ids))
    end = logits[rows, ends]
    return (end[rows, contrast[0]] - end[rows, contrast[1]]).double().numpy()


@pytest.mark.parametrize("path", ["k", "v"])
def test_one_sender_into_one_receivers_input_matches_hooks_by_hand(llama, groups, path):
    sender, receiver = (0, 1), (1, 2)
    clean, patched = path_changes(llama, groups, [sender], [receiver], (path,), CFG)
    want = []
    for prompts in groups.values():
        ids = torch.tensor([p.ids for p in prompts])
        twin = torch.tensor([p.corrupted for p in prompts])
        ends = torch.tensor([p.roles["END"] for p in prompts])
        contrast = (torch.tensor([p.io_id for p in prompts]),
                    torch.tensor([p.s_id for p in prompts]))
        want.append(_by_hand(llama, ids, twin, sender, receiver, path, ends, contrast))
    want = np.concatenate(want) - clean
    np.testing.assert_allclose(patched[:, 0] - clean, want, rtol=0.02, atol=1e-6)
    assert np.abs(want).max() > 1e-4  # a hundred times the tolerance


def _rows(kind, effects, highs, attentions):
    return pd.DataFrame([{"layer": 0, "head": h, "receiver_kind": kind, "receivers": "L1H0",
                          "path": "kv", "effect": e, "ci_low": e - 0.1, "ci_high": hi,
                          "attention_s2_s1": a[0], "attention_s2_s1p1": a[1],
                          "attention_s1p1_s1": a[2], "n_prompts": 6}
                         for h, (e, hi, a) in enumerate(zip(effects, highs, attentions,
                                                            strict=True))])


def test_classes_need_the_effect_and_the_attention_and_real_receivers():
    attentions = [(0.5, 0.0, 0.0), (0.0, 0.4, 0.0), (0.05, 0.05, 0.9), (0.6, 0.0, 0.0)]
    rows = _rows("s-inhibition", [-0.3, -0.2, -0.4, -0.3], [-0.15, -0.11, -0.2, -0.05],
                 attentions)
    classes = upstream_class_rows(rows, BEHAVIOUR, CFG)
    # H0 attends S2->S1 (duplicate-token), H1 S2->S1+1 (induction); H2 has the effect but
    # neither attention; H3 the attention but an interval reaching above -0.1
    assert sorted(zip(classes.head_class, classes["head"], strict=True)) == [
        ("duplicate-token", 0), ("induction", 1)]
    assert classes.claimed.all()
    # through candidates, nothing is classified
    assert upstream_class_rows(rows.assign(receiver_kind="s-inhibition candidates"),
                               BEHAVIOUR, CFG).empty
    # the candidates: attention at least min_attention, the most negative effects first
    targets, kind = upstream_receivers(rows, pd.DataFrame(), "induction",
                                       "attention_s2_s1p1", CFG)
    assert (targets, kind) == ([(0, 1)], "induction candidates")
    targets, kind = upstream_receivers(rows, classes, "induction", "attention_s2_s1p1", CFG)
    assert (targets, kind) == ([(0, 1)], "induction")


def test_only_heads_that_attend_as_a_sender_class_must_are_patched():
    """Into the S-inhibition heads (deepest at layer 2) the senders are the heads of layers
    0 and 1 attending S2 -> S1 or S2 -> S1+1 with at least min_attention; into the induction
    heads, those attending S1+1 -> S1."""
    model = SimpleNamespace(info=SimpleNamespace(n_heads=2))
    heads = pd.MultiIndex.from_tuples([(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)],
                                      names=["layer", "head"])
    weights = {"duplicate-token": pd.Series([0.5, 0.0, 0.0, 0.09, 0.9], index=heads),
               "induction": pd.Series([0.0, 0.0, 0.1, 0.05, 0.9], index=heads),
               "previous-token": pd.Series([0.0, 0.3, 0.0, 0.0, 0.9], index=heads)}
    targets = [(2, 1), (1, 0)]
    assert upstream_senders(model, targets, "s-inhibition", weights, CFG) == [(0, 0), (1, 0)]
    assert upstream_senders(model, targets, "induction", weights, CFG) == [(0, 1)]
    assert upstream_senders(model, [(0, 1)], "induction", weights, CFG) == []
