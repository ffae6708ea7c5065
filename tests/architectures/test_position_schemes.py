"""The position schemes behind the permutation checks, each against its definition.

BLOOM's ALiBi shift moves every score of head ``h`` by ``slope_h * c`` (Press et al. 2022's
slopes, computed here by hand); GPT-Neo's own mask can be lifted; a short context gets an
``n/a`` ICL score. (That "RoPE removed" removes every rotary variant is checked by the
matrix: the whole model without RoPE and mask must be permutation-equivariant.)
"""

from __future__ import annotations

import math

import torch
import transformers

from experiments.induction_heads import Config as InductionConfig
from experiments.induction_heads.measure import icl_tables
from tests import tiny
from workbench.models.adapters import alibi_shifted, own_mask_lifted
from workbench.models.load import load_model
from workbench.recording import hooks

IDS = torch.tensor([[0, 7, 9, 11, 13, 15, 17]])


def _capture(model, names, **kwargs):
    kept, keep = hooks.caching_hooks(names)
    with model.bridge.hooks(fwd_hooks=keep):
        model.bridge(IDS, return_type=None, **kwargs)
    return kept


def test_alibi_shift_adds_slope_times_c_to_every_score(families):
    model = families.model("bloom")
    n_heads, c = model.info.n_heads, 37
    # Press et al. 2022: slopes 2^(-8/n), 2^(-16/n), ... for n a power of two
    slopes = torch.tensor([2 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)])
    names = [hooks.scores(0), hooks.pattern(0)]
    base = _capture(model, names)
    with alibi_shifted(model, c):
        shifted = _capture(model, names)
    causal = torch.ones(IDS.shape[1], IDS.shape[1]).tril().bool()
    diff = (shifted[names[0]] - base[names[0]])[0][:, causal]  # [head, visible pairs]
    torch.testing.assert_close(diff, (slopes * c)[:, None].expand_as(diff), atol=1e-4, rtol=0)
    torch.testing.assert_close(shifted[names[1]], base[names[1]], atol=1e-5, rtol=0)
    after = _capture(model, names)  # the model's own method is back
    torch.testing.assert_close(after[names[0]], base[names[0]], atol=0, rtol=0)


def test_gpt_neo_own_mask_is_lifted_only_inside_the_block(families):
    model = families.model("gpt-neo")
    n = IDS.shape[1]
    zeros = torch.zeros(1, 1, n, n)  # an additive mask that hides nothing
    with own_mask_lifted(model):
        free = _capture(model, [hooks.pattern(0)], attention_mask=zeros)[hooks.pattern(0)]
    own = _capture(model, [hooks.pattern(0)], attention_mask=zeros)[hooks.pattern(0)]
    upper = ~torch.ones(n, n).tril().bool()
    assert float(free[0][:, upper].min()) > 0  # queries see later keys
    assert float(own[0][:, upper].abs().max()) == 0  # its own causal mask is back


def test_icl_score_is_na_with_the_reason_on_a_short_context(families, tmp_path):
    tokenizer = families.tokenizer("gpt2")
    cfg = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4,
                                  n_positions=128, n_inner=64, bos_token_id=0, eos_token_id=1,
                                  pad_token_id=3)
    cfg._attn_implementation = "eager"
    folder = tiny.save_folder(transformers.GPT2LMHeadModel(cfg).eval(), tokenizer,
                              tmp_path / "short")
    model = load_model(str(folder))
    icl, by_position, by_prompt = icl_tables(model, InductionConfig(icl_prompts=2, n_boot=10))
    assert len(by_position) == 127  # every position of the 128-token windows but BOS
    assert icl.value.isna().all() and icl.definition.str.startswith("n/a").all()
    assert by_prompt["icl_by_prompt"].value.isna().all()  # per window too, not a made-up score
    assert len(by_prompt["loss_by_prompt"]) == 2 * 127
    assert "128 tokens" in icl.definition.iloc[0]
    long = icl_tables(families.model("gpt2"), InductionConfig(icl_prompts=2, icl_tokens=501,
                                                              icl_halfwidth=0, n_boot=10))[0]
    assert long.value.map(math.isfinite).all()  # a 512-token context gets a score
