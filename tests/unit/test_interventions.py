"""Head masks: invariants of the intervention, checked against weight surgery."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from tests import tiny
from workbench.core.errors import WorkbenchError
from workbench.inputs.prompts import Prompt
from workbench.interventions.masks import HeadMask, applied, donors, head_means

PROMPTS = [Prompt(text="the cat sat on the mat"), Prompt(text="bread is made from flour")]


def logits(model, prompt=PROMPTS[0]):
    ids = torch.tensor([model.encode(prompt)[0]])
    with torch.inference_mode():
        return model.bridge(ids)


def final_resid(model, prompt=PROMPTS[0]):
    """The encoder's last hidden state (its LM head is random, so compare this instead)."""
    ids = torch.tensor([model.encode(prompt)[0]])
    with torch.inference_mode():
        _, cache = model.bridge.run_with_cache(ids, names_filter=lambda n: n.endswith(
            f"blocks.{model.info.n_layers - 1}.hook_resid_post"))
    return next(iter(cache.values()))


@pytest.mark.parametrize("which", ["llama", "bert"])
def test_all_ones_mask_changes_nothing_bit_for_bit(which, request):
    model = request.getfixturevalue(which)
    out = final_resid if which == "bert" else logits
    before = out(model)
    for ablation in ("zero", "mean"):
        with applied(model, HeadMask.for_model(model, ablation=ablation)):
            assert torch.equal(out(model), before)


def _o_proj(model, layer):
    block = model.bridge.original_model
    if hasattr(block, "model"):  # Llama
        return block.model.layers[layer].self_attn.o_proj
    return block.bert.encoder.layer[layer].attention.output.dense


@pytest.mark.parametrize("which, heads", [("llama", [(1, 2)]), ("llama", [(0, 0), (1, 3)]),
                                          ("bert", [(0, 1)])])
def test_masking_a_head_equals_removing_its_output_projection_slice(which, heads, request,
                                                                     tokenizer, bert_tokenizer):
    model = request.getfixturevalue(which)
    out = final_resid if which == "bert" else logits
    with applied(model, HeadMask.for_model(model).without(heads)):
        masked = out(model)
    surgery = tiny.wrap(request.getfixturevalue(f"{which}_hf"),
                        bert_tokenizer if which == "bert" else tokenizer, "surgery")
    d_head = model.info.d_head
    with torch.no_grad():
        for layer, head in heads:
            _o_proj(surgery, layer).weight[:, head * d_head:(head + 1) * d_head] = 0
    torch.testing.assert_close(masked, out(surgery), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(masked, out(model), atol=1e-4)


def test_grouped_query_masks_query_heads_not_key_value_heads(llama):
    # heads 0 and 1 share key-value head 0: masking one of them is not masking both
    with applied(llama, HeadMask.for_model(llama).without([(1, 0)])):
        one = logits(llama)
    with applied(llama, HeadMask.for_model(llama).without([(1, 0), (1, 1)])):
        both = logits(llama)
    assert not torch.allclose(one, both, atol=1e-4)


def test_masks_compose(llama):
    a = HeadMask.for_model(llama).without([(0, 1)])
    b = HeadMask.for_model(llama).without([(1, 2)])
    b.values[0, 3] = 0.5
    with applied(llama, a), applied(llama, b):
        nested = logits(llama)
    with applied(llama, a.compose(b)):
        composed = logits(llama)
    torch.testing.assert_close(nested, composed, atol=1e-6, rtol=1e-6)


def test_head_means_are_means_over_real_tokens(llama):
    means = head_means(llama, PROMPTS)
    zs = []
    for prompt in PROMPTS:  # unpadded, one prompt at a time
        ids = torch.tensor([llama.encode(prompt)[0]])
        with torch.inference_mode():
            _, cache = llama.bridge.run_with_cache(ids, names_filter=lambda n: "hook_z" in n)
        zs.append(torch.stack([cache[f"blocks.{layer}.attn.hook_z"][0] for layer in range(2)]))
    ref = torch.cat(zs, dim=1).mean(1)  # [layer, head, d_head]
    torch.testing.assert_close(means, ref, atol=1e-5, rtol=1e-5)


def test_mean_ablation_with_the_input_itself_as_reference_changes_nothing(llama):
    one_token = Prompt(token_ids=(llama.info.bos_token_id,))
    means = head_means(llama, [one_token])
    mask = HeadMask.for_model(llama, ablation="mean").without([(0, 0), (1, 3)])
    before = logits(llama, one_token)
    with applied(llama, mask, means=means):
        torch.testing.assert_close(logits(llama, one_token), before, atol=1e-5, rtol=1e-5)
    with applied(llama, HeadMask.for_model(llama).without([(0, 0), (1, 3)])):
        assert not torch.allclose(logits(llama, one_token), before, atol=1e-4)


def test_zero_mask_ignores_means(llama):
    means = head_means(llama, PROMPTS)
    zero = HeadMask.for_model(llama).without([(0, 1)])
    with applied(llama, zero):
        plain = logits(llama)
    with applied(llama, zero, means=means):
        assert torch.equal(logits(llama), plain)
    with applied(llama, HeadMask.for_model(llama, ablation="mean").without([(0, 1)]),
                 means=means):
        assert not torch.allclose(logits(llama), plain, atol=1e-4)


def test_gradient_flows_to_mask_values(llama):
    values = torch.ones(2, 4, requires_grad=True)
    mask = HeadMask(values)
    ids = torch.tensor([llama.encode(PROMPTS[0])[0]])
    with applied(llama, mask):
        loss = llama.bridge(ids, return_type="loss")
    loss.backward()
    assert values.grad is not None and values.grad.abs().sum() > 0


def test_save_load_and_shape_checks(llama, bert, tmp_path):
    mask = HeadMask.for_model(llama, ablation="mean", note="test").without([(1, 1)])
    loaded = HeadMask.load(mask.save(tmp_path / "m.json"))
    assert torch.equal(loaded.values, mask.values) and loaded.ablation == "mean"
    assert loaded.removed() == [(1, 1)] and loaded.model == "tiny-llama"
    with pytest.raises(WorkbenchError, match="tiny-bert has 2 x 4"):
        HeadMask.ones(3, 4, model="other").check(bert)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(WorkbenchError, match=r"bad\.json has no 'format'"):
        HeadMask.load(tmp_path / "bad.json")
    with pytest.raises(WorkbenchError, match="unknown ablation"):
        HeadMask.ones(2, 4, ablation="shuffle")
    assert copy.deepcopy(mask).removed() == mask.removed()


def test_heads_mask_on_the_command_line(capsys, runs_dir, llama_folder, tmp_path):
    """--heads-mask on record and run: stored with the run, and it acts from the masked
    head's layer on (layer 0 patterns unchanged, layer 1 patterns changed)."""
    import numpy as np

    from workbench.recording.reader import Recording
    from workbench.store.runs import RunStore

    mask = HeadMask.ones(2, 4, model="tiny-llama").without([(0, 1), (0, 2)])
    path = mask.save(tmp_path / "mask.json")
    text = ["--text", "the cat sat on the mat and the dog sat on the rug"]
    plain = Recording.open(tiny.cli(capsys, "record", str(llama_folder), *text)[1][-1])
    status, out, _ = tiny.cli(capsys, "record", str(llama_folder), *text, "--heads-mask", str(path))
    assert status == 0
    masked = Recording.open(out[-1])
    run = RunStore(runs_dir).get(out[-1])
    assert [list(row) for row in run.meta.interventions.heads_mask.mask] == mask.values.tolist()
    np.testing.assert_array_equal(masked.pattern(0, 0), plain.pattern(0, 0))
    assert not np.allclose(masked.pattern(0, 1), plain.pattern(0, 1), atol=1e-3)

    args = ["run", "head-overview", "--model", str(llama_folder), "--set", "n_boot=20"]
    base = RunStore(runs_dir).get(tiny.cli(capsys, *args)[1][-1]).table("head_scores")
    status, out, _ = tiny.cli(capsys, *args, "--heads-mask", str(path))
    assert status == 0
    run = RunStore(runs_dir).get(out[-1])
    assert run.meta.interventions.heads_mask.ablation == "zero"
    scores = run.table("head_scores")
    # the tiny random model attends almost uniformly, so its scores move only slightly
    layer0 = (scores.layer == 0) & (scores.metric == "entropy")
    np.testing.assert_array_equal(scores[layer0].score, base[layer0].score)
    layer1 = (scores.layer == 1) & (scores.metric == "entropy")
    assert not np.array_equal(scores[layer1].score, base[layer1].score)

    n_runs = len(RunStore(runs_dir).runs())
    HeadMask.ones(3, 4).save(tmp_path / "wrong.json")
    status, _, err = tiny.cli(capsys, *args, "--heads-mask", str(tmp_path / "wrong.json"))
    assert status == 2 and "head mask is 3 layers x 4 heads" in err
    status, _, err = tiny.cli(capsys, *args, "--heads-mask", str(tmp_path / "missing.json"))
    assert status == 2 and "cannot read head mask" in err
    assert len(RunStore(runs_dir).runs()) == n_runs  # bad masks create no run


@pytest.mark.parametrize("batch", [2, 3, 5, 8])
def test_resample_donors_are_a_derangement_fixed_by_the_seed(batch):
    for seed in range(20):
        d = donors(batch, seed)
        assert sorted(d.tolist()) == list(range(batch))  # a permutation
        assert bool((d != torch.arange(batch)).all())  # no prompt is its own donor
        seen, b = set(), 0
        while b not in seen:  # one cycle through the whole batch
            seen.add(b)
            b = int(d[b])
        assert len(seen) == batch
        assert torch.equal(d, donors(batch, seed))
    if batch > 3:
        assert len({tuple(donors(batch, s).tolist()) for s in range(20)}) > 1
    with pytest.raises(WorkbenchError, match="this batch holds 1 prompt"):
        donors(1, 0)


def _single_cycle(batch, seed):
    """The donors of a batch of one length, written out apart from the library: one
    random cycle through the whole batch, as resample masks drew them before they paired
    prompts by length (stored runs stay reproducible)."""
    order = torch.randperm(batch, generator=torch.Generator().manual_seed(seed))
    out = torch.empty(batch, dtype=torch.long)
    for i in range(batch):
        out[order[i]] = order[(i + 1) % batch]
    return out


@pytest.mark.parametrize("batch", [2, 3, 4, 7])
def test_a_batch_of_one_length_gets_the_single_cycle_it_always_got(batch):
    for seed in (0, 1, 5, 123456789):
        want = _single_cycle(batch, seed)
        assert torch.equal(donors(batch, seed), want)
        assert torch.equal(donors([9] * batch, seed), want)
        assert torch.equal(donors(torch.full((batch,), 4), seed), want)


def test_donors_pair_prompts_of_one_length():
    lengths = [5, 7, 5, 7, 7, 3, 3, 5]
    for seed in range(20):
        d = donors(lengths, seed)
        assert sorted(d.tolist()) == list(range(len(lengths)))
        for b, donor in enumerate(d.tolist()):
            assert donor != b and lengths[donor] == lengths[b]
        for n in set(lengths):  # one cycle through each length's prompts
            members = [b for b, m in enumerate(lengths) if m == n]
            seen, b = set(), members[0]
            while b not in seen:
                seen.add(b)
                b = int(d[b])
            assert seen == set(members)
        assert torch.equal(d, donors(lengths, seed))
    assert len({tuple(donors(lengths, s).tolist()) for s in range(20)}) > 1


@pytest.mark.parametrize("lengths, lone", [
    ([5, 5, 7], "5 tokens x2, 7 tokens x1, and the prompt of 7 tokens has no other"),
    ([3, 5, 5, 7], "3 tokens x1, 5 tokens x2, 7 tokens x1, and the prompts of 3 and 7 "
                   "tokens have no other")])
def test_a_prompt_alone_of_its_length_is_refused_in_one_line(lengths, lone):
    with pytest.raises(WorkbenchError) as caught:
        donors(lengths, 0)
    message = str(caught.value)
    assert lone in message and "\n" not in message
    assert "prompts of one length" in message and "max_batch_tokens" in message


def _ragged(model, lengths, seed=0):
    """Random prompts of ``lengths``, right-padded into one batch, and its attention mask."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), model.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(5, model.info.d_vocab, (n,), generator=gen)
        mask[b, :n] = 1
    return ids, mask


def test_a_ragged_batch_resamples_each_prompt_from_one_of_its_length(llama):
    lengths, seed = [5, 7, 5, 7], 2
    ids, attention = _ragged(llama, lengths)
    donor = donors(lengths, seed).tolist()
    assert [lengths[d] for d in donor] == lengths
    assert [donor[d] for d in donor] == [0, 1, 2, 3]  # pairs: each is its donor's donor
    mask = HeadMask.for_model(llama, ablation="resample", seed=seed).without([(0, 1), (1, 3)])
    with applied(llama, mask), torch.inference_mode():
        got = llama.logits(ids, attention_mask=attention)
        _, cache = llama.bridge.run_with_cache(ids, attention_mask=attention,
                                               names_filter=lambda n: "hook_z" in n)
    z0 = cache["blocks.0.attn.hook_z"]
    for b, n in enumerate(lengths):
        # by hand: each prompt run alone; L0H1 is its donor's clean output alone, and L1H3
        # its donor's output in the donor's own pass ablated the same way below it
        alone = [_z(llama, ids[i:i + 1, :n]) for i in (b, donor[b])]
        torch.testing.assert_close(z0[b, :n, 1], alone[1][0][0, :, 1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(z0[b, :n, 0], alone[0][0][0, :, 0], atol=1e-5, rtol=1e-5)
        want = _patched_alone(llama, ids[b:b + 1, :n], ids[donor[b]:donor[b] + 1, :n])
        torch.testing.assert_close(got[b, :n], want[0], atol=1e-4, rtol=1e-4)


def _patched_alone(model, ids, donor_ids):
    """``ids`` run alone with L0H1 and L1H3 taken from ``donor_ids`` run alone, whose own
    L0H1 is taken from ``ids`` (two prompts of one length are each other's donors)."""
    def setting(head, value):
        def hook(z, hook):
            z = z.clone()
            z[:, :, head] = value
            return z
        return hook

    with torch.inference_mode():
        clean_self, clean_donor = (_z(model, x, layers=(0,))[0][:, :, 1]
                                   for x in (ids, donor_ids))
        with model.bridge.hooks(fwd_hooks=[("blocks.0.attn.hook_z", setting(1, clean_self))]):
            donor_l1 = _z(model, donor_ids, layers=(1,))[0][:, :, 3]
        with model.bridge.hooks(fwd_hooks=[("blocks.0.attn.hook_z", setting(1, clean_donor)),
                                           ("blocks.1.attn.hook_z", setting(3, donor_l1))]):
            return model.bridge(ids)


def test_a_prompt_alone_of_its_length_stops_the_pass(llama):
    ids, attention = _ragged(llama, [5, 5, 7])
    mask = HeadMask.for_model(llama, ablation="resample").without([(1, 0)])
    with applied(llama, mask), torch.inference_mode():
        with pytest.raises(WorkbenchError, match="the prompt of 7 tokens has no other"):
            llama.logits(ids, attention_mask=attention)
        llama.logits(ids)  # no mask given: every position counts, one cycle through all 3


def _z(model, ids, layers=(0, 1)):
    """Every layer's ``hook_z`` of ``ids``, as the pass (with any hooks already on) gives it."""
    with torch.inference_mode():
        _, cache = model.bridge.run_with_cache(ids, names_filter=lambda n: "hook_z" in n)
    return [cache[f"blocks.{layer}.attn.hook_z"] for layer in layers]


def test_a_resampled_head_takes_its_donors_clean_output(llama):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(5, llama.info.d_vocab, (3, 7), generator=gen)  # one length: no padding
    clean = [_z(llama, ids[b:b + 1]) for b in range(3)]  # each prompt alone
    seed = 4
    donor = donors(3, seed).tolist()
    mask = HeadMask.for_model(llama, ablation="resample", seed=seed).without([(0, 1)])
    with applied(llama, mask):
        z0, z1 = _z(llama, ids)
    for b in range(3):
        # by hand: head 1 of prompt b is head 1 of its donor, alone and unablated
        want = clean[b][0][0].clone()
        want[:, 1] = clean[donor[b]][0][0][:, 1]
        torch.testing.assert_close(z0[b], want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(z1, torch.cat([c[1] for c in clean]), atol=1e-4)

    # two layers: the layer-1 donor's output is the one of the pass already ablated below
    both = HeadMask.for_model(llama, ablation="resample", seed=seed).without([(0, 1), (1, 2)])
    with applied(llama, both):
        _, y1 = _z(llama, ids)
    for b in range(3):
        want = z1[b].clone()
        want[:, 2] = z1[donor[b]][:, 2]
        torch.testing.assert_close(y1[b], want, atol=1e-5, rtol=1e-5)


def test_a_resample_mask_batches_prompts_in_pairs_of_one_length(llama):
    from workbench.inputs.prompts import Prompt

    # two prompts of one length over a budget of one: alone, each would have no donor
    prompts = [Prompt(text="the cat sat on the mat and the dog"),  # the same words
               Prompt(text="the dog sat on the mat and the cat")]
    lengths = [len(llama.encode(p)[0]) for p in prompts]
    assert lengths[0] == lengths[1]
    assert [len(b.indices) for b in llama.batches(prompts, max_tokens=lengths[0])] == [1, 1]
    mask = HeadMask.for_model(llama, ablation="resample").without([(0, 1)])
    with applied(llama, mask):
        (batch,) = llama.batches(prompts, max_tokens=lengths[0])
        assert sorted(batch.indices) == [0, 1]
        with torch.inference_mode():
            llama.bridge(batch.input_ids, attention_mask=batch.attention_mask)
    assert not llama.paired_batches  # restored
    zero = HeadMask.for_model(llama).without([(0, 1)])
    with applied(llama, zero):
        assert [len(b.indices) for b in llama.batches(prompts, max_tokens=lengths[0])] == [1, 1]


def test_resample_with_an_all_ones_mask_changes_nothing(llama):
    ids = torch.randint(5, llama.info.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        before = llama.bridge(ids)
    mask = HeadMask.for_model(llama, ablation="resample", seed=7)
    with applied(llama, mask), torch.inference_mode():
        assert torch.equal(llama.bridge(ids), before)


def test_resample_masks_save_their_seed_and_old_files_load_as_seed_0(llama, tmp_path):
    mask = HeadMask.for_model(llama, ablation="resample", seed=11).without([(1, 1)])
    loaded = HeadMask.load(mask.save(tmp_path / "r.json"))
    assert (loaded.ablation, loaded.seed, loaded.removed()) == ("resample", 11, [(1, 1)])
    old = {"format": "workbench-heads-mask", "version": 1, "model": "tiny-llama",
           "n_layers": 2, "n_heads": 4, "ablation": "zero", "reference": "natural",
           "note": "", "mask": [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]}
    (tmp_path / "old.json").write_text(json.dumps(old))  # written before masks had a seed
    assert HeadMask.load(tmp_path / "old.json").seed == 0
    assert HeadMask.from_json({**old, "ablation": "resample"}).seed == 0
    with pytest.raises(WorkbenchError, match="seed"):
        HeadMask.from_json({**old, "seed": -1})
    with pytest.raises(WorkbenchError, match="only with one seed"):
        mask.compose(HeadMask.for_model(llama, ablation="resample", seed=12))
