"""Wall times are read from the stored runs of exactly the default or the demo config."""

from __future__ import annotations

import json

from tests.tiny import fake_info
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import get
from workbench.harness.timing import wall_times
from workbench.store.records import ModelInfo
from workbench.store.runs import RunStore


def _model(dtype: str = "float32") -> ModelInfo:
    return fake_info("m", "0" * 64, dtype=dtype)


def _set_times(store: RunStore, run_id: str, start: str, end: str) -> None:
    """Give a stored run chosen start and end times (run.json is the record of both)."""
    path = store.get(run_id).path / "run.json"
    meta = json.loads(path.read_text())
    meta.update(started_at=start, ended_at=end)
    path.write_text(json.dumps(meta))


def test_each_named_config_is_timed_from_its_own_newest_run(runs_dir):
    exp = get("induction-heads")
    store = RunStore(runs_dir)
    configs = [
        ("old default", exp.config(), _model(), "10:00:00", "10:01:00"),
        ("new default", exp.config(), _model(), "11:00:00", "11:02:30"),
        ("demo", apply_overrides(exp.config, dict(exp.demo)), _model(), "12:00:00", "12:00:20"),
        ("other", apply_overrides(exp.config, {"n_boot": 7}), _model(), "13:00:00", "13:09:00"),
        ("bf16", exp.config(), _model("bfloat16"), "14:00:00", "14:00:01"),
    ]
    for _, cfg, model, start, end in configs:
        with store.start(exp.name, model, cfg) as run:
            pass
        _set_times(store, run.id, f"2026-12-01T{start}+00:00", f"2026-12-01T{end}+00:00")
    times = wall_times(exp, store)
    assert [(t.config, t.model, t.seconds) for t in times] == [
        ("default", "m", 150.0), ("demo", "m", 20.0)]
