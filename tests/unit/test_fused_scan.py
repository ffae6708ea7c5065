"""Head scores through the fused kernel (:mod:`workbench.recording.fused_scan`) against
the blocked path's, on tiny random models, under Triton's interpreter on CPU.

The fused path is forced (``attention="fused"``): on CPU ``auto`` keeps the blocked path.
Every metric that declares kernel statistics must score each head within 1e-5 (float32)
of the blocked path, on rotary grouped-query families (Llama, Qwen 2, Gemma 3 with its
sliding layers and one key-value head, Gemma 2's soft-cap), fused-QKV ones (GPT-2,
GPT-NeoX's partial rotary) and a ragged, padded batch; anything the kernel cannot serve
keeps the blocked path, and the run says which path it took.

Largest differences measured (2026-12-06, the six families below): 1.9e-6 for
``mean_distance`` (in tokens), 4.8e-7 for ``entropy``, 4.5e-8 or less for the weights.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (the 'fused' extra)", allow_module_level=True)
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("without CUDA the kernels run only under TRITON_INTERPRET=1",
                allow_module_level=True)

from tests import tiny
from tests.architectures import families
from workbench.core import attention as notes
from workbench.harness.config import param, shared
from workbench.harness.experiment import experiment, run_experiment
from workbench.inputs.prompts import Prompt
from workbench.recording import fused_scan
from workbench.recording.reductions import PatternContext, reduce_patterns
from workbench.scores import metrics, patterns
from workbench.store.schema import head_scores, tables

BOUND = 1e-5
DECLARING = sorted(name for name, m in metrics.METRICS.items()
                   if m.statistics and m.reduction is not None)
PROMPTS = [Prompt(label="repeat", text="the cat sat on the mat the cat sat on the mat again"),
           Prompt(label="letters", text="a b c d e f g h a b c d e f g h a b c d e f g h i j"),
           Prompt(label="short", text="one two one two")]


def _scan(model, names, attention, prompts=PROMPTS):
    with notes.collecting() as taken:
        frame = reduce_patterns(model, prompts, metrics.reductions(*names),
                                attention=attention, max_batch_tokens=4096)
    return frame, notes.taken(taken)


@pytest.fixture(scope="module")
def models(tokenizer):
    built = {}

    def get(name):
        if name not in built:
            built[name] = tiny.wrap(families.build(name, len(tokenizer)), tokenizer,
                                    f"tiny-{name}")
        return built[name]
    return get


def test_every_declaring_pattern_metric_is_read_off_the_kernel() -> None:
    assert DECLARING == ["entropy", "first_token", "induction", "mean_distance",
                         "previous_token"]
    for name in DECLARING:
        assert metrics.get(name).reduction.from_statistics is not None  # type: ignore[union-attr]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma-3", "gemma-2", "gpt2",
                                    "gpt-neox"])
def test_fused_scores_equal_the_blocked_paths(models, family) -> None:
    model = models(family)
    blocked, path_b = _scan(model, DECLARING, "blocked")
    fused, path_f = _scan(model, DECLARING, "fused")
    assert (path_b, path_f) == ("blocked", "fused")
    assert blocked[["prompt", "layer", "head", "metric"]].equals(
        fused[["prompt", "layer", "head", "metric"]])
    assert blocked.score.notna().all() and fused.score.notna().all()
    assert float((blocked.score - fused.score).abs().max()) <= BOUND
    # the prompts make induction heads measurable: some targets exist on every prompt
    assert (blocked[blocked.metric == "induction"].score > 0).all()


def test_one_layer_of_a_model_is_read_and_the_pass_stops(models) -> None:
    model = models("llama")
    blocked, _ = _scan(model, ["previous_token"], "blocked")
    fused, path = reduce_patterns(model, PROMPTS, metrics.reductions("previous_token"),
                                  attention="fused", layers=[0]), "fused"
    want = blocked[blocked.layer == 0].reset_index(drop=True)
    assert float((want.score - fused.score).abs().max()) <= BOUND and path == "fused"


def test_a_metric_without_statistics_keeps_the_blocked_path(models) -> None:
    model = models("llama")
    frame, path = _scan(model, ["previous_token", "self_attention"], "fused")
    assert path == "blocked" and set(frame.metric) == {"previous_token", "self_attention"}


def test_a_family_the_kernel_lacks_keeps_the_blocked_path(models) -> None:
    model = models("bloom")  # ALiBi biases
    frame, path = _scan(model, ["previous_token"], "fused")
    assert path == "blocked" and frame.score.notna().all()


def test_a_layer_whose_mask_is_not_the_kernels_keeps_its_blocks(models, monkeypatch,
                                                                 caplog) -> None:
    """A variant that disagrees with the model's own mask (here a window the model does
    not have) is caught on the checked rows: that layer's scores come from its blocks."""
    from workbench.models.fused import Variant

    model = models("llama")
    blocked, _ = _scan(model, DECLARING, "blocked")
    monkeypatch.setattr(fused_scan.FusedScan, "variant",
                        lambda self, s: Variant(window=4, scale=s.scale))
    fused, path = _scan(model, DECLARING, "fused")
    assert path == "blocked" and "keeps the blocked path: the model's mask" in caplog.text
    assert float((blocked.score - fused.score).abs().max()) <= BOUND


def test_auto_keeps_the_blocked_path_on_cpu(models) -> None:
    _, path = _scan(models("llama"), ["previous_token"], "auto")
    assert path == "blocked"


def test_auto_takes_the_kernel_on_cuda(models, monkeypatch) -> None:
    """The device is all ``auto`` reads: reported as CUDA, the scan takes the kernel (which
    the interpreter runs on the CPU tensors)."""
    monkeypatch.setattr(fused_scan, "_device", lambda model: torch.device("cuda"))
    model = models("llama")
    frame, path = _scan(model, ["previous_token", "first_token"], "auto")
    blocked, _ = _scan(model, ["previous_token", "first_token"], "blocked")
    assert path == "fused" and float((frame.score - blocked.score).abs().max()) <= BOUND
    _, path = _scan(model, ["previous_token", "normalized_entropy"], "auto")
    assert path == "blocked"


def test_dense_is_recorded_as_eager(models) -> None:
    _, path = _scan(models("llama"), ["previous_token"], "dense")
    assert path == "eager"


def test_induction_targets_by_sorting_are_the_pairwise_ones(tokenizer) -> None:
    torch.manual_seed(0)
    ids = torch.randint(4, 12, (3, 40))
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[1, 25:] = False
    mask[2, 7:] = False
    ctx = PatternContext(input_ids=ids, lengths=mask.sum(-1), query_mask=mask, layer=0,
                         causal=True)
    pairwise = patterns.second_repeat_targets(ctx)
    want = torch.where(pairwise.any(-1), pairwise.float().argmax(-1), -1)
    assert torch.equal(fused_scan.induction_target_keys(ctx), want)


# ---- what a run records --------------------------------------------------------------------

@dataclass(frozen=True)
class ScanConfig:
    metrics: str = param("previous_token,induction", "comma-separated metrics to scan")
    max_batch_tokens: int = shared("max_batch_tokens")
    seed: int = shared("seed")


class _NoTables:
    def tables(self) -> dict:
        return {}

    def summary(self) -> list[str]:
        return []


@experiment("test-fused-scan", config=ScanConfig, tables=tables(head_scores("scanned")), demo={})
def _scan_experiment(model, cfg: ScanConfig, ctx=None) -> _NoTables:
    reduce_patterns(model, PROMPTS, metrics.reductions(*cfg.metrics.split(",")),
                    max_batch_tokens=cfg.max_batch_tokens)
    return _NoTables()


def _stored(run) -> dict:
    return json.loads((run.path / "run.json").read_text())


@pytest.mark.parametrize(("attention", "names", "taken"), [
    ("fused", "previous_token,induction", "fused"),
    ("fused", "previous_token,self_attention", "blocked"),
    ("auto", "previous_token,induction", "blocked"),
    ("dense", "previous_token", "eager"),
])
def test_the_run_records_the_path_its_attention_took(llama, runs_dir, attention, names,
                                                     taken) -> None:
    run = run_experiment("test-fused-scan", llama, {"metrics": names}, runs_dir=runs_dir,
                         attention=attention)
    stored = _stored(run)
    assert run.meta.attention == taken and stored["attention"] == taken
    assert stored["peak_rss_mib"] > 0 and stored["peak_gpu_mib"] is None  # no CUDA here


def test_an_unknown_attention_path_is_refused(llama, runs_dir) -> None:
    from workbench.core.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match="attention must be one of auto, blocked, dense, "
                                             "fused, got 'flash'"):
        run_experiment("test-fused-scan", llama, runs_dir=runs_dir,
                       attention="flash")  # type: ignore[arg-type]


def test_a_cuda_out_of_memory_error_leaves_a_failed_run_that_says_what_to_do(
        llama, runs_dir, monkeypatch) -> None:
    from workbench.recording import hooks
    from workbench.store.runs import RunStore

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 3.50 GiB is free.")

    monkeypatch.setattr(hooks, "run_hooked", out_of_memory)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        run_experiment("test-fused-scan", llama, {"max_batch_tokens": 4096},
                       runs_dir=runs_dir)
    (failed,) = RunStore(runs_dir).runs(status="failed")
    error = _stored(failed)["error"]
    assert error.startswith("CUDA out of memory: the run asked for 20.00 GiB more than the "
                            "GPU had free; run it again with a smaller max_batch_tokens")
    assert failed.meta.attention == "blocked" and failed.meta.peak_rss_mib is not None


def test_show_prints_the_path_and_the_peaks(llama, runs_dir, capsys) -> None:
    run = run_experiment("test-fused-scan", llama, runs_dir=runs_dir, attention="fused")
    code, lines, _ = tiny.cli(capsys, "show", run.id, "--out", str(runs_dir))
    assert code == 0
    assert "attention  fused" in lines
    assert any(line.startswith("memory     peak RSS ") and "GPU" not in line for line in lines)


@pytest.mark.parametrize("patterns", ["topk", "qk"])
def test_a_recording_keeps_the_blocked_path_and_says_so(llama_folder, runs_dir, capsys,
                                                        patterns) -> None:
    code, _, err = tiny.cli(capsys, "record", str(llama_folder), "--text", "one two one two",
                            "--patterns", patterns, "--out", str(runs_dir))
    assert code == 0, err
    (run_json,) = runs_dir.glob("*/run.json")
    assert json.loads(run_json.read_text())["attention"] == "blocked"
