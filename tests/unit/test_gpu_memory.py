"""Peak GPU memory where a run uses CUDA: recorded in ``run.json`` beside peak RSS and shown
in progress lines. No GPU here: ``torch.cuda`` is replaced by a stand-in that reports a
started device and a peak, so what is tested is the reading and the recording."""

from __future__ import annotations

import io
import json

import pytest

from workbench.core import progress
from workbench.store import provenance
from workbench.store.runs import RunStore

PEAK = 3 * 2**30 + 2**29  # 3.5 GiB


class FakeCuda:
    """``torch.cuda`` of a process that has started CUDA: its peak since the last reset."""

    def __init__(self) -> None:
        self.resets = 0

    def is_initialized(self) -> bool:
        return True

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1

    def max_memory_allocated(self) -> int:
        return PEAK


@pytest.fixture
def cuda(monkeypatch) -> FakeCuda:
    fake = FakeCuda()
    monkeypatch.setattr(provenance, "_cuda", lambda: fake)
    return fake


def test_without_cuda_the_gpu_peak_is_none_and_rss_is_recorded() -> None:
    peaks = provenance.peak_memory()
    assert peaks["peak_gpu_mib"] is None and (peaks["peak_rss_mib"] or 0) > 0


def test_a_run_records_its_gpu_peak_from_a_reset_at_its_start(cuda, tmp_path) -> None:
    store = RunStore(tmp_path)
    with store.start("record", None, {}) as run:
        assert cuda.resets == 1
    stored = json.loads((store.get(run.id).path / "run.json").read_text())
    assert stored["peak_gpu_mib"] == 3584.0 and stored["peak_rss_mib"] > 0


def test_a_failed_run_records_its_gpu_peak_too(cuda, tmp_path) -> None:
    store = RunStore(tmp_path)
    with pytest.raises(RuntimeError), store.start("record", None, {}) as run:
        raise RuntimeError("boom")
    assert store.get(run.id).meta.peak_gpu_mib == 3584.0


def test_progress_lines_show_the_gpu_peak_when_there_is_one(cuda) -> None:
    from workbench.cli.render import _PlainBars

    stream = io.StringIO()
    progress.render_with(_PlainBars(stream, lambda: 0.0))
    try:
        with progress.stages("exp", 1) as stage:
            stage("scan")
    finally:
        progress.render_with(None)
    assert stream.getvalue().splitlines()[0] == ("exp [step 1/1: scan] (under 1 s elapsed, "
                                                 "peak GPU 3.5 GiB)")


def test_a_cuda_run_defaults_to_bfloat16_only_where_the_experiment_keeps_its_bounds():
    """The bf16 table of docs/performance.md calls previous-token-heads safe in bfloat16
    (tests/integration/test_bf16.py holds it to its bounds) and nothing else whole: a run
    on CUDA with no --dtype loads that one in bfloat16, every other in float32, and CPU
    stays float32."""
    from workbench.cli import build_parser
    from workbench.harness.experiment import all_experiments, default_dtype

    safe = {exp.name for exp in all_experiments() if exp.bf16_safe}
    assert safe == {"previous-token-heads"}
    for exp in all_experiments():
        assert default_dtype(exp, "cpu") == "float32"
        assert default_dtype(exp, "cuda:1") == ("bfloat16" if exp.name in safe else "float32")
    args = build_parser().parse_args(["run", "ioi", "--model", "smollm2"])
    assert args.dtype is None  # left to the experiment
    assert build_parser().parse_args(["record", "smollm2", "--text", "a"]).dtype == "float32"
