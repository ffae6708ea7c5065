"""The validation matrix: every experiment's smallest config on a tiny random model of every
family, each cell *works* or *n/a with a reason*, as ``workbench models --families`` says.

References: Hugging Face's own eager ``output_attentions`` (patterns), the zero-masked
model (heads removed from the weights), and what the mathematics says each
permutation-equivariance condition must give (no verdict may be ``fail``).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from tests import tiny
from tests.architectures.families import BUILDERS, ENCODERS
from workbench.core.errors import ModelCapabilityError
from workbench.harness.experiment import all_experiments, get, run_experiment
from workbench.harness.matrix import cell, family_matrix
from workbench.inputs.prompts import Prompt
from workbench.interventions.masks import HeadMask, applied
from workbench.models import zoo
from workbench.models.adapters import FAMILIES, adapter_for
from workbench.models.surgery import hf_forward, plain_copy, remove_heads
from workbench.recording import hooks
from workbench.recording.writer import record

ADAPTERS = {family: adapter_for(cls) for family, (cls, _) in BUILDERS.items()}
SUPPORTED = [f for f, a in ADAPTERS.items() if not a.unsupported]
UNSUPPORTED = [f for f, a in ADAPTERS.items() if a.unsupported]

SMALL = {
    "head-overview": {"n_boot": 20},
    "previous-token-heads": {"n_prompts": 2, "n_tokens": 16, "n_repeated": 2, "seq_len": 8,
                             "n_boot": 20},
    "induction-heads": {"n_prompts": 2, "seq_len": 8, "n_natural": 2, "n_ablate": 1,
                        "n_track": 1, "n_random": 1, "n_path_random": 1, "icl_prompts": 2,
                        "icl_tokens": 501,
                        "icl_halfwidth": 0, "copying_tokens": 16, "n_boot": 20},
    "attention-sinks": {"n_prompts": 2, "seq_len": 12, "stream_tokens": 40, "window": 12,
                        "n_sinks": 2, "sink_sweep": (1,), "chunk": 16, "recompute_stride": 8,
                        "n_massive_prompts": 2, "n_boot": 20},
    "permutation-equivariance": {"n_prompts": 1, "max_tokens": 10, "seeds": (0, 1),
                                 "shifts": (1, 100)},
    "head-pruning": {"fit_tokens": 64, "ablation_tokens": 32, "eval_tokens": 32,
                     "chunk_tokens": 32, "repeat_prompts": 2, "repeat_len": 4, "probes": 2,
                     "importance": ("gradient",), "reverse": False, "n_random": 1,
                     "step_fraction": 0.25, "max_fraction": 0.5, "n_boot": 20,
                     "speed_repeats": 5, "budgets": (0.25,)},
    "qk-attribution": {"n_prompts": 2, "n_random": 2, "n_boot": 20, "patch_prompts": 1},
    # the tiny tokenizer's only words that are one token with their leading space
    "ioi": {"names": "and dog on sat the", "places": "dog", "objects": "sat", "n_prompts": 4,
            "templates": 2, "patch_prompts": 2, "n_receivers": 1, "n_boot": 20},
    "logit-lens": {"prompt_set": "natural", "n_prompts": 2, "n_boot": 20},
    "induction-distance": {"n_prompts": 2, "seq_len": 4, "distances": (4, 12), "n_boot": 20},
    "circuit": {"task": "induction", "n_prompts": 2, "seq_len": 4, "steps": 2, "n_exact": 2,
                "fractions": (0.1, 1.0), "n_boot": 20},
}
"""The smallest config of each experiment that still runs every part of it."""
PROMPTS = [Prompt(text="the cat sat on the mat and the dog sat"), Prompt(text="bread is made")]


def test_every_family_has_a_tiny_model_and_every_experiment_a_small_config():
    assert sorted(ADAPTERS.values(), key=lambda a: a.family) == [a for _, a in FAMILIES.items()]
    assert len(SUPPORTED) >= 22
    shipped = (e for e in all_experiments() if e.module.startswith("experiments."))
    assert {e.name for e in shipped if e.needs_model} <= set(SMALL)


@pytest.mark.parametrize("family", UNSUPPORTED)
def test_unsupported_families_are_refused_in_one_line(families, family, capsys):
    folder = str(families.folder(family))
    capsys.readouterr()  # saving the folder may draw a progress bar
    status, out, err = tiny.cli(capsys, "run", "head-overview", "--model", folder)
    assert status == 2 and not out
    assert err.count("\n") == 1 and "is not supported" in err and "Traceback" not in err


def _hf_reference(families, family: str):
    """The family's folder loaded by plain Hugging Face with eager attention."""
    auto = transformers.AutoModelForMaskedLM if family in ENCODERS else \
        transformers.AutoModelForCausalLM
    return auto.from_pretrained(str(families.folder(family)), attn_implementation="eager").eval()


@pytest.mark.parametrize("family", SUPPORTED)
def test_recorded_patterns_equal_huggingface(families, family, tmp_path):
    model, hf_model = families.model(family), _hf_reference(families, family)
    rec = record(model, PROMPTS, tmp_path / "rec", store_dtype="float32", include_resid=False)
    for i, prompt in enumerate(PROMPTS):
        ids, types = model.encode(prompt)
        kwargs = {"token_type_ids": torch.tensor([types])} if types is not None else {}
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids]), output_attentions=True, **kwargs).attentions
        for layer in range(model.info.n_layers):
            np.testing.assert_allclose(rec.pattern(i, layer), ref[layer][0].numpy(), atol=1e-6)


@pytest.mark.parametrize("family", [f for f in SUPPORTED if not ADAPTERS[f].removal_reason()])
def test_heads_removed_from_the_weights_compute_the_zero_masked_model(families, family):
    model = families.model(family)
    batch = model.batches(PROMPTS)[0]
    # layer 0 keeps heads 0, 2, 3 (uneven over kv groups where there are groups); layer 1 none
    values = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    removed = remove_heads(plain_copy(model), values)
    with torch.inference_mode():
        got = hf_forward(removed, batch, causal=model.info.causal)
        with applied(model, HeadMask(values)):
            if model.info.causal:
                want = model.bridge(batch.input_ids, attention_mask=batch.attention_mask)
            else:
                want = _masked_body(model, batch)
    real = batch.attention_mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    full = sum(p.numel() for p in plain_copy(model).parameters())
    assert sum(p.numel() for p in removed.parameters()) < full


def _masked_body(model, batch):
    """An encoder's final hidden states (after its last block's norm) under a mask."""
    name = f"blocks.{model.info.n_layers - 1}.hook_out"
    return hooks.capture(model, batch, [name])[name]


@pytest.mark.parametrize(("family", "experiment"),
                         [(f, e) for f in SUPPORTED for e in SMALL])
def test_matrix_cell_is_what_a_run_gives(families, family, experiment, tmp_path):
    expected = cell(ADAPTERS[family], get(experiment))
    model = families.model(family)
    if not expected.works:
        with pytest.raises(ModelCapabilityError):
            run_experiment(experiment, model, SMALL[experiment], runs_dir=tmp_path)
        return
    run = run_experiment(experiment, model, SMALL[experiment], runs_dir=tmp_path)
    assert run.status == "complete"
    if experiment == "head-pruning":
        _check_removal_step(run, ADAPTERS[family].removal_reason())
    if experiment == "permutation-equivariance":
        _check_verdicts(run, family)
    if experiment in ("ioi", "logit-lens"):  # the parts sum, patching restores, lens is output
        assert (run.table("checks").value <= 1e-4).all(), run.table("checks")


def _check_removal_step(run, reason: str | None) -> None:
    speed = run.table("speedup")
    assert len(speed)
    if reason:  # only the removal step is skipped, and the table says why
        assert (speed.skipped == reason).all() and speed.speedup.isna().all()
    else:
        # (parameters may not drop: uneven GQA groups turn a layer multi-head)
        assert (speed.skipped == "").all() and (speed.max_abs_diff < 1e-4).all()


def _check_verdicts(run, family: str) -> None:
    """Every measured verdict is what the mathematics says; n/a always says why."""
    verdicts = run.table("verdicts")
    assert not (verdicts.verdict == "fail").any(), verdicts[verdicts.verdict == "fail"]
    assert (verdicts[verdicts.verdict == "n/a"].note != "").all()
    by = verdicts.set_index(["component", "condition"]).verdict
    # no positions and no mask: the sublayer is a set function, exactly equivariant
    assert by[("attention sublayer", "no positions, no mask")] == "pass"
    assert by[("attention heads", "permuted with W_O slices (weights)")] == "pass"
    positions = ADAPTERS[family].positions
    if positions == "rotary" and family not in ENCODERS:
        assert by[("whole model", "RoPE removed, no mask")] == "pass"
    if positions == "alibi":
        assert (verdicts[verdicts.condition == "position ids + c, ALiBi"].verdict
                == "pass").all()


def _table(lines: list[str], title: str) -> dict[str, str]:
    """The rows of the table under ``title``, by their first cell."""
    start = lines.index(title) + 3  # the title, the header and its rule
    end = lines.index("", start)
    return {line.split()[0]: line for line in lines[start:end]}


def test_models_families_prints_the_matrix(capsys):
    status, out, _ = tiny.cli(capsys, "models", "--families")
    assert status == 0
    rows = _table(out, "On tiny random weights (every family):")
    assert set(rows) == set(FAMILIES.names())
    for c in family_matrix():
        if not c.works and not ADAPTERS.get(c.family, FAMILIES.get(c.family)).unsupported:
            assert f"* {c.family} / {c.experiment}: n/a: {c.reason}" in out
    assert "n/a" in rows["t5"] and "works" not in rows["t5"]


def test_the_models_page_shows_the_matrix_the_command_prints():
    """docs/models.md quotes ``workbench models --families``: the quote is what it prints
    (in a process of its own: tests register experiments of their own in this one)."""
    done = subprocess.run([sys.executable, "-m", "workbench", "--quiet", "models",
                           "--families"], capture_output=True, text=True, check=True)
    out = done.stdout.strip().splitlines()
    page = (Path(__file__).parents[2] / "docs" / "models.md").read_text()
    start = page.index("```text\nOn tiny random weights (every family):") + len("```text\n")
    quoted = page[start: page.index("```", start)]
    assert quoted.splitlines() == out, "docs/models.md: paste `workbench models --families`"


def test_falcon_variants_with_another_fused_layout_are_not_sliced():
    """Falcon-40B's ``new_decoder_architecture`` groups q/k/v per kv head: slicing it as
    ``[q | k | v]`` would compute something else, so removal is refused with the reason."""
    cfg = transformers.FalconConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, num_kv_heads=2,
                                    new_decoder_architecture=True)
    model = transformers.FalconForCausalLM(cfg).eval()
    with pytest.raises(ModelCapabilityError, match="per kv group"):
        remove_heads(model, torch.ones(1, 4))


def test_falcon_without_multi_query_is_sliced_per_head():
    """Falcon without ``multi_query`` lays its fused projection out per head,
    ``(head, 3, d_head)``, not ``[q | k | v]``: removing heads from it computes the model whose
    removed heads' outputs are zeroed (their columns of ``dense``), exactly."""
    torch.manual_seed(0)
    cfg = transformers.FalconConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, multi_query=False, alibi=False)
    model = transformers.FalconForCausalLM(cfg).eval()
    values = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        for block, keep in zip(zeroed.transformer.h, values, strict=True):
            dense = block.self_attention.dense.weight.view(32, 4, 8)
            dense[:, keep == 0] = 0.0
    removed = remove_heads(copy.deepcopy(model), values)
    ids = torch.randint(0, 300, (2, 11))
    with torch.inference_mode():
        torch.testing.assert_close(removed(ids).logits, zeroed(ids).logits, atol=1e-6, rtol=0)
    assert removed.transformer.h[0].self_attention.query_key_value.weight.shape[0] == 3 * 3 * 8


def test_the_bundled_models_are_the_rows_on_real_weights_apart(capsys):
    _, out, _ = tiny.cli(capsys, "models", "--families")
    real = _table(out, "On real weights (the bundled models, each its family's row on one "
                       "real model):")
    tiny_rows = _table(out, "On tiny random weights (every family):")
    assert set(real) == set(zoo.MODELS.names()) == {"gemma3", "minilm", "smollm2"}
    n = len({c.experiment for c in family_matrix()})
    for name, family in (("smollm2", "llama"), ("minilm", "bert"), ("gemma3", "gemma-3")):
        assert real[name].split()[1] == family
        # the same cells as the family's row on tiny random weights
        assert real[name].split()[-n:] == tiny_rows[family].split()[-n:]
    assert "18: 15 sliding (512), 3 global" in real["gemma3"] and "30 global" in real["smollm2"]
