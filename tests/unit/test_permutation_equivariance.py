"""Permutation equivariance on tiny random models: the sublayer checked against the reference
attention, the seeded permutations, the tables against their declarations, and the
experiment's verdicts. (The primitives it uses have their own tests: test_head_permutation,
test_positions.)"""

from __future__ import annotations

import json

import einops
import numpy as np
import pandas as pd
import pytest
import torch

from experiments.permutation_equivariance import DEMO, Config, run
from experiments.permutation_equivariance.conditions import BY_NAME
from experiments.permutation_equivariance.measure import encode_prompts, sublayer
from experiments.permutation_equivariance.permutations import (
    full_permutation,
    prefix_permutation,
    seeded_head_permutation,
)
from experiments.permutation_equivariance.tables import TABLES
from workbench.core import paths
from workbench.core.errors import ConfigError, WorkbenchError
from workbench.harness import claims
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import run_experiment
from workbench.scores import attention as ref

SMALL = {"n_prompts": 2, "max_tokens": 12, "seeds": (0, 1), "shifts": (1, 100, 600)}


@pytest.fixture(scope="module")
def llama_result(llama):
    return run(llama, Config(**SMALL))


@pytest.fixture(scope="module")
def bert_result(bert):
    return run(bert, Config(**SMALL))


def inputs(model, n=7, seed=0):
    return torch.randn(1, n, model.info.d_model, generator=torch.Generator().manual_seed(seed))


# ---- config -----------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ({"n_prompts": 0}, "n_prompts"), ({"max_tokens": 3}, "max_tokens"),
    ({"seeds": (1, 1)}, "distinct"), ({"seeds": ()}, "non-empty"),
    ({"shifts": (0,)}, "shifts: expected at least 1"), ({"layers": (-1,)}, "layers"),
    ({"view_layers": (-1,)}, "view_layers"), ({"view_prompts": -1}, "view_prompts"),
    ({"model_tolerance": 0.0}, "model_tolerance"), ({"sublayer_tolerance": 1.0}, "at most"),
    ({"prompt_set": "nope"}, "unknown prompt set"),
])
def test_bad_config_is_refused(override, message):
    with pytest.raises((ConfigError, WorkbenchError), match=message):
        apply_overrides(Config, override)


def test_lists_become_tuples_and_text_parses():
    assert apply_overrides(Config, {"seeds": [3, 4]}).seeds == (3, 4)
    assert apply_overrides(Config, ["shifts=5,50", "layers=0"]).shifts == (5, 50)


def test_layers_out_of_range_are_refused(llama):
    with pytest.raises(WorkbenchError, match="out of range"):
        run(llama, Config(layers=(7,)))
    with pytest.raises(WorkbenchError, match="view_layers"):
        run(llama, Config(layers=(0,), view_layers=(1,)))


# ---- permutations -----------------------------------------------------------------------

def test_permutations_are_seeded_and_never_the_identity():
    for n in (2, 5, 30):
        for seed in range(5):
            perm = full_permutation(n, seed, 0)
            assert sorted(perm.tolist()) == list(range(n)) and perm.tolist() != list(range(n))
            assert torch.equal(perm, full_permutation(n, seed, 0))
    assert not torch.equal(full_permutation(30, 0, 0), full_permutation(30, 1, 0))


def test_prefix_permutation_moves_only_the_prefix():
    for seed in range(10):
        i, perm = prefix_permutation(12, seed, 3)
        assert 2 <= i <= 11
        assert perm[i:].tolist() == list(range(i, 12))
        assert sorted(perm[:i].tolist()) == list(range(i)) and perm[:i].tolist() != list(range(i))


def test_head_permutations_are_fixed_by_seed_and_layer():
    first = seeded_head_permutation(9, 3, 0, 2)
    assert all(torch.equal(a, b) for a, b in zip(first, seeded_head_permutation(9, 3, 0, 2),
                                                 strict=True))
    others = [seeded_head_permutation(9, 3, seed, layer)[0].tolist()
              for seed, layer in [(1, 2), (0, 3), (2, 5)]]
    assert any(o != first[0].tolist() for o in others)


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
        out, pattern = sublayer(model, 1, x, rope=False, causal=causal)
        want_out, want_pattern = reference_sublayer(
            model, 1, x, ref.causal_mask(7) if causal else ref.full_mask(7))
    np.testing.assert_allclose(pattern, want_pattern, atol=1e-6)
    np.testing.assert_allclose(out, want_out, atol=1e-6)


def test_encoder_prompts_keep_their_final_separator(bert):
    enc = encode_prompts(bert, "natural", n_prompts=2, max_tokens=6)
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


def test_every_table_matches_its_declaration(llama_result, bert_result):
    for result in (llama_result, bert_result):
        tables = result.tables()
        assert set(tables) == set(TABLES)
        for name, df in tables.items():
            TABLES[name].check(df)
            assert list(df.columns) == TABLES[name].names
        assert result.summary()[0].endswith("checks as expected")


def test_errors_by_prompt_reduce_to_the_verdicts(llama_result, bert_result):
    for result in (llama_result, bert_result):
        by_prompt, verdicts = result.by_prompt, result.verdicts
        measured = verdicts[verdicts.verdict != "n/a"].set_index(["component", "condition",
                                                                   "shift"])
        groups = by_prompt.groupby(["component", "condition", "shift"])
        assert set(groups.groups) == set(measured.index)
        reduced = pd.DataFrame({"max_rel_error": groups.max_rel_error.max(),
                                "min_rel_error": groups.min_rel_error.min(),
                                "n_cases": groups.n_cases.sum()})
        stored = measured.loc[reduced.index, reduced.columns]
        np.testing.assert_allclose(reduced.to_numpy(float), stored.to_numpy(float),
                                   rtol=1e-12)
        assert set(by_prompt.prompt) == set(range(SMALL["n_prompts"]))
        # one digest per prompt, of its ids as cut
        assert (by_prompt.groupby("prompt").tokens.nunique() == 1).all()
        assert by_prompt.groupby("prompt").tokens.first().nunique() == SMALL["n_prompts"]


def test_no_stored_patterns_is_still_a_declared_table(bert):
    result = run(bert, Config(n_prompts=1, max_tokens=8, seeds=(0,), shifts=(1,),
                              layers=(0,), view_prompts=0))
    assert result.patterns.empty
    TABLES["patterns"].check(result.patterns)


def test_relative_error_is_relative_to_the_largest_output_over_the_positions_chosen():
    before = torch.tensor([[1.0, -4.0], [2.0, 0.0], [0.5, 0.5]])
    after = before.clone()
    after[0, 1] += 0.4
    after[2, 0] += 0.1
    assert ref.relative_error(after, before, before) == pytest.approx(0.4 / 4)
    # positions from 1 on: the larger error at position 0 is left out, the scale is not
    assert ref.relative_error(after, before, before, slice(1, None)) == pytest.approx(0.1 / 4)
    assert ref.relative_error(before, before, before) == 0


def test_claims_name_real_conditions_and_pass_on_tiny_models(llama, bert, runs_dir):
    entries = json.loads((paths.data_dir() / "claims" / "permutation_equivariance.json")
                         .read_text())
    loaded = {c.id: c for c in claims.load_claims()}
    demo = apply_overrides(Config, dict(DEMO))
    runs = {m.info.name: run_experiment("permutation-equivariance", m, DEMO,
                                        runs_dir=runs_dir) for m in (llama, bert)}
    for entry in entries:
        claim = loaded[entry["id"]]
        # `reproduce` reuses demo runs
        assert apply_overrides(Config, claims.claim_config(claim)) == demo
        names = claim.check.params["condition"]
        for name in [names] if isinstance(names, str) else names:
            assert (claim.check.params["component"], name) in BY_NAME
        for model in (llama, bert):
            bundled = "smollm2" if model.info.causal else "minilm"
            if bundled not in claim.models:
                continue
            measured = claims.evaluate(claim, runs[model.info.name])
            assert measured.outcome == "pass", (claim.id, measured.measured)
