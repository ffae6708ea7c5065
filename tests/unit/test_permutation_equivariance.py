"""Permutation equivariance on tiny random models: plumbing checked against the reference
attention, permutations, hooks that remove positions, and the experiment's verdicts."""

from __future__ import annotations

import json

import einops
import numpy as np
import pytest
import torch

from experiments import permutation_equivariance as pe
from workbench.core import paths
from workbench.core.errors import ConfigError, WorkbenchError
from workbench.harness import claims
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import run_experiment
from workbench.scores import attention as ref

SMALL = {"n_prompts": 2, "max_tokens": 12, "seeds": (0, 1), "shifts": (1, 100, 600)}


@pytest.fixture(scope="module")
def llama_result(llama):
    return pe.run(llama, pe.Config(**SMALL))


@pytest.fixture(scope="module")
def bert_result(bert):
    return pe.run(bert, pe.Config(**SMALL))


def inputs(model, n=7, seed=0):
    return torch.randn(1, n, model.info.d_model, generator=torch.Generator().manual_seed(seed))


# ---- config -----------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ({"n_prompts": 0}, "n_prompts"), ({"max_tokens": 3}, "max_tokens"),
    ({"seeds": (1, 1)}, "distinct"), ({"seeds": ()}, "non-empty"), ({"shifts": (0,)}, "positive"),
    ({"view_prompts": -1}, "view_prompts"), ({"model_tolerance": 0.0}, "tolerances"),
    ({"prompt_set": "nope"}, "unknown prompt set"),
])
def test_bad_config_is_refused(override, message):
    with pytest.raises((ConfigError, WorkbenchError), match=message):
        apply_overrides(pe.Config, override)


def test_lists_become_tuples_and_text_parses():
    assert apply_overrides(pe.Config, {"seeds": [3, 4]}).seeds == (3, 4)
    assert apply_overrides(pe.Config, ["shifts=5,50", "layers=0"]).shifts == (5, 50)


def test_layers_out_of_range_are_refused(llama):
    with pytest.raises(WorkbenchError, match="out of range"):
        pe.run(llama, pe.Config(layers=(7,)))
    with pytest.raises(WorkbenchError, match="view_layers"):
        pe.run(llama, pe.Config(layers=(0,), view_layers=(1,)))


# ---- permutations -----------------------------------------------------------------------

def test_permutations_are_seeded_and_never_the_identity():
    for n in (2, 5, 30):
        for seed in range(5):
            perm = pe.full_permutation(n, seed, 0)
            assert sorted(perm.tolist()) == list(range(n)) and perm.tolist() != list(range(n))
            assert torch.equal(perm, pe.full_permutation(n, seed, 0))
    assert not torch.equal(pe.full_permutation(30, 0, 0), pe.full_permutation(30, 1, 0))


def test_prefix_permutation_moves_only_the_prefix():
    for seed in range(10):
        i, perm = pe.prefix_permutation(12, seed, 3)
        assert 2 <= i <= 11
        assert perm[i:].tolist() == list(range(i, 12))
        assert sorted(perm[:i].tolist()) == list(range(i)) and perm[:i].tolist() != list(range(i))


@pytest.mark.parametrize("n_heads, n_kv", [(9, 3), (4, 2), (12, 12), (8, 1)])
def test_head_permutation_keeps_each_query_head_with_its_kv_head(n_heads, n_kv):
    r = n_heads // n_kv
    for seed in range(5):
        q_perm, kv_perm = pe.head_permutation(n_heads, n_kv, seed, layer=2)
        assert sorted(q_perm.tolist()) == list(range(n_heads))
        assert q_perm.tolist() != list(range(n_heads))
        # new head j reads new kv head j // r = old kv head kv_perm[j // r], which must be
        # the kv head of the old query head it now is
        assert all(int(q_perm[j]) // r == int(kv_perm[j // r]) for j in range(n_heads))


# ---- the bridge's sublayer against the reference implementation -------------------------

def reference_sublayer(model, layer, x, mask):
    """MHA from the weights with workbench.scores.attention: no RoPE, GQA by h // r."""
    attn = model.bridge.blocks[layer].attn
    info = model.info
    d, r = info.d_head, info.n_heads // info.n_kv_heads

    def project(bridge, n):
        lin = bridge.original_component
        out = x[0] @ lin.weight.T + (lin.bias if lin.bias is not None else 0)
        return einops.rearrange(out, "pos (h d) -> h pos d", h=n, d=d)

    q = project(attn.q, info.n_heads)
    k = project(attn.k, info.n_kv_heads).repeat_interleave(r, dim=0)
    v = project(attn.v, info.n_kv_heads).repeat_interleave(r, dim=0)
    out = ref.attention(q, k, v, mask)
    z = einops.rearrange(out.output, "h pos d -> pos (h d)")
    o = attn.o.original_component
    return (z @ o.weight.T + (o.bias if o.bias is not None else 0))[None], out.weights[None]


@pytest.mark.parametrize("name", ["llama", "bert"])
@pytest.mark.parametrize("causal", [False, True])
def test_position_free_sublayer_matches_the_reference(request, name, causal):
    model = request.getfixturevalue(name)
    x = inputs(model)
    with torch.no_grad():
        out, pattern = pe.sublayer(model, 1, x, rope=False, causal=causal)
        want_out, want_pattern = reference_sublayer(
            model, 1, x, ref.causal_mask(7) if causal else ref.full_mask(7))
    np.testing.assert_allclose(pattern, want_pattern, atol=1e-6)
    np.testing.assert_allclose(out, want_out, atol=1e-6)


def test_removing_rope_by_hooks_equals_an_identity_rotation(llama):
    x = inputs(llama)
    attn = llama.bridge.blocks[0].attn
    with torch.no_grad():
        out, _ = pe.sublayer(llama, 0, x, rope=False, causal=True)
        cos, sin = llama.bridge.rotary_emb(x, torch.arange(7)[None])
        store = {}
        with llama.bridge.hooks(fwd_hooks=[("blocks.0.attn.o.hook_out",
                                            pe._capture(store, "out"))]):
            attn(x, position_embeddings=(torch.ones_like(cos), torch.zeros_like(sin)),
                 attention_mask=None)  # the bridge's own causal mask
        with_rope, _ = pe.sublayer(llama, 0, x, rope=True, causal=True)
    torch.testing.assert_close(out, store["out"], atol=1e-7, rtol=0)
    # the hook really removed something (relative: the tiny model's outputs are ~1e-2)
    assert pe.relative_error(with_rope, out, out) > 1e-3


def test_without_rope_position_ids_no_longer_matter(llama):
    enc = pe.encode_prompts(llama, pe.Config(n_prompts=1, max_tokens=10))[0]
    hooks_ = pe.no_rope_hooks(range(llama.info.n_layers))
    with torch.no_grad():
        base = pe.model_output(llama, enc, fwd_hooks=hooks_)
        shifted = pe.model_output(llama, enc, fwd_hooks=hooks_,
                                  position_ids=torch.arange(10)[None] + 300)
        rope = pe.model_output(llama, enc, position_ids=torch.arange(10)[None] + 300)
    torch.testing.assert_close(base, shifted, atol=1e-6, rtol=0)
    assert torch.isfinite(rope).all()


def test_float64_angles_agree_with_the_model_and_refuse_other_models(llama, bert):
    pos = torch.arange(9)[None] + 5
    x = inputs(llama, 9)
    store = {}
    fwd = [*pe.float64_angle_hooks(llama, pos),
           ("rotary_emb.hook_cos", pe._capture(store, "cos"))]
    with torch.no_grad(), llama.bridge.hooks(fwd_hooks=fwd):
        llama.bridge.rotary_emb(x, pos)
    cos, _ = llama.bridge.rotary_emb(x, pos)
    torch.testing.assert_close(store["cos"], cos, atol=1e-6, rtol=0)
    with pytest.raises(WorkbenchError, match="inv_freq"):
        pe.float64_angle_hooks(bert, pos)


def test_head_weights_are_restored_even_after_an_error(llama):
    attn = llama.bridge.blocks[1].attn
    before = [p.detach().clone() for p in (attn.q.original_component.weight,
                                           attn.o.original_component.weight)]
    q_perm, kv_perm = pe.head_permutation(4, 2, 0, 1)
    with pytest.raises(RuntimeError, match="boom"), \
            pe.permuted_head_weights(llama, 1, q_perm, kv_perm):
        assert not torch.equal(attn.q.original_component.weight, before[0])
        raise RuntimeError("boom")
    assert torch.equal(attn.q.original_component.weight, before[0])
    assert torch.equal(attn.o.original_component.weight, before[1])


def test_encoder_prompts_keep_their_final_separator(bert):
    enc = pe.encode_prompts(bert, pe.Config(n_prompts=2, max_tokens=6))
    for e in enc:
        assert e.ids.shape[1] == 6 and e.tokens[0] == "[CLS]" and e.tokens[-1] == "[SEP]"
        assert e.type_ids is None or e.type_ids.shape == e.ids.shape


# ---- the experiment's verdicts ----------------------------------------------------------

def verdict(result, condition, shift=0):
    table = result.verdicts
    row = table[(table.condition == condition) & (table["shift"] == shift)]
    assert len(row) == 1, condition
    return row.iloc[0]


def test_every_applicable_check_meets_its_expectation(llama_result, bert_result):
    for result in (llama_result, bert_result):
        measured = result.verdicts[result.verdicts.verdict != "n/a"]
        assert set(measured.verdict) == {"pass"}, measured[measured.verdict != "pass"]
        assert (measured.n_cases > 0).all()


def test_equivariant_conditions_are_at_float_precision(llama_result, bert_result):
    for result in (llama_result, bert_result):
        assert verdict(result, "no positions, no mask").max_rel_error < 1e-6
        assert verdict(result, "no positions, causal mask, prefix permutation"
                       ).max_rel_error < 1e-6
        assert verdict(result, "no positions, causal mask").min_rel_error > 1e-2
        assert verdict(result, "permuted via hooks on q, k, v, undone at z").max_rel_error == 0
    assert verdict(bert_result, "position embeddings zeroed").max_rel_error < 1e-6
    assert verdict(llama_result, "RoPE removed, no mask").max_rel_error < 1e-6
    assert verdict(llama_result, "position ids + c", 100).max_rel_error < 1e-5


def test_conditions_that_do_not_apply_say_why(llama_result, bert_result):
    assert "no position embeddings" in verdict(llama_result, "position embeddings zeroed").note
    assert "no RoPE" in verdict(bert_result, "RoPE, no mask").note
    assert "no groups" in verdict(bert_result,
                                  "query heads moved across kv groups (control)").note
    assert "beyond" in verdict(bert_result, "position ids + c, learned positions", 600).note
    assert "imposed" in verdict(bert_result, "no positions, causal mask").note
    # a shift a learned-position model can hold changes its output, by design
    assert verdict(bert_result, "position ids + c, learned positions", 100).verdict == "pass"


def test_stored_patterns_permuted_back_equal_the_originals(llama_result):
    patterns, perms = llama_result.patterns, llama_result.permutations
    assert set(patterns.condition) == {"no positions, no mask", "no positions, causal mask",
                                       "RoPE, no mask"}
    pick = patterns[(patterns.condition == "no positions, no mask") & (patterns.prompt == 0)
                    & (patterns.layer == 1) & (patterns["head"] == 2)]
    n = int(pick["query"].max()) + 1

    def grid(rows):
        out = np.zeros((n, n))
        out[rows["query"], rows["key"]] = rows.weight
        return out

    perm = perms[(perms.prompt == 0) & (perms.seed == 1) & (perms.kind == "full")]
    inverse = np.argsort(perm.sort_values("position").source.to_numpy())
    after = grid(pick[pick.seed == 1])
    np.testing.assert_allclose(after[inverse][:, inverse], grid(pick[pick.input == "original"]),
                               atol=1e-6)


def test_summary_and_tables(llama_result):
    tables = llama_result.tables()
    assert set(tables) == {"equivariance", "verdicts", "patterns", "tokens", "permutations"}
    cases = tables["equivariance"]
    for column in ("model", "component", "condition", "seed", "max_rel_error", "tolerance",
                   "verdict"):
        assert column in cases.columns
    assert llama_result.summary()[0].endswith("checks as expected")


def test_claims_name_real_conditions_and_pass_on_tiny_models(llama, bert, runs_dir):
    entries = json.loads((paths.data_dir() / "claims" / "permutation_equivariance.json")
                         .read_text())
    loaded = {c.id: c for c in claims.load_claims()}
    demo = apply_overrides(pe.Config, dict(pe.DEMO))
    runs = {m.info.name: run_experiment("permutation-equivariance", m, pe.DEMO,
                                        runs_dir=runs_dir) for m in (llama, bert)}
    for entry in entries:
        claim = loaded[entry["id"]]
        # `reproduce` reuses demo runs
        assert apply_overrides(pe.Config, claims.claim_config(claim)) == demo
        names = claim.check["condition"]
        for name in [names] if isinstance(names, str) else names:
            assert (claim.check["component"], name) in pe.BY_NAME
        for model in (llama, bert):
            bundled = "smollm2" if model.info.causal else "minilm"
            if bundled not in claim.models:
                continue
            measured = claims.evaluate(claim, runs[model.info.name])
            assert measured.passed, (claim.id, measured.measured)
