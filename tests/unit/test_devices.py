"""``--device`` and ``WORKBENCH_DEVICE``: every spelling and every missing device is refused
in one line before a model loads; CUDA's paths are checked with torch's answers patched."""

from __future__ import annotations

import pytest
import torch

from tests.tiny import cli
from workbench.core import devices
from workbench.core.errors import WorkbenchError


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this machine has ``n`` CUDA devices (0: no CUDA at all)."""

    def have(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return have


@pytest.mark.parametrize(("text", "name"), [("cpu", "cpu"), (" CPU ", "cpu"),
                                            ("cuda:00", "cuda:0"), ("Cuda:12", "cuda:12")])
def test_the_known_spellings_are_read_without_torch(text, name):
    assert devices.parse_device(text) == name


@pytest.mark.parametrize("text", ["gpu", "cuda:", "cuda:-1", "cuda:one", "", "cuda 0",
                                  "cpu:0", "xla"])
def test_an_unknown_spelling_lists_the_known_forms(text):
    with pytest.raises(WorkbenchError, match=r"unknown device .*; expected one of cpu, cuda, "
                                             r"cuda:N, mps") as info:
        devices.check_device(text)
    assert "\n" not in str(info.value)


def test_cuda_on_a_machine_without_it_is_refused(gpus):
    gpus(0)
    for name in ("cuda", "cuda:0"):
        with pytest.raises(WorkbenchError) as info:
            devices.check_device(name)
        assert str(info.value) == (f"{name}: not available on this machine "
                                   "(torch.cuda.is_available() is False)")


def test_a_cuda_index_beyond_the_devices_is_refused(gpus):
    gpus(2)
    assert devices.check_device("cuda") == "cuda"
    assert devices.check_device("cuda:1") == "cuda:1"
    with pytest.raises(WorkbenchError) as info:
        devices.check_device("cuda:2")
    assert str(info.value) == "cuda:2: this machine has 2 CUDA devices (cuda:0 .. cuda:1)"
    gpus(1)
    with pytest.raises(WorkbenchError, match=r"has 1 CUDA device \(cuda:0 \.\. cuda:0\)"):
        devices.check_device("cuda:1")


def test_mps_on_a_machine_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(WorkbenchError, match=r"^mps: not available on this machine "
                                             r"\(torch.backends.mps.is_available\(\) is False\)$"):
        devices.check_device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert devices.check_device("mps") == "mps"


def test_the_option_wins_over_the_environment_which_wins_over_cpu(monkeypatch, gpus):
    gpus(1)
    monkeypatch.delenv(devices.DEVICE_ENV, raising=False)
    assert devices.chosen_device(None) == "cpu"
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda")
    assert devices.chosen_device(None) == "cuda"
    assert devices.chosen_device("cpu") == "cpu"
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda:3")
    with pytest.raises(WorkbenchError, match=r"cuda:3: .*\(from WORKBENCH_DEVICE\)$"):
        devices.chosen_device(None)


@pytest.mark.parametrize("command", [
    ["run", "head-overview", "--model", "smollm2"],
    ["record", "smollm2", "--text", "hello"],
    ["reproduce"],
    ["demo", "--models", "minilm"],
])
def test_every_command_refuses_a_missing_device_before_a_model_loads(
        capsys, monkeypatch, runs_dir, gpus, command):
    from workbench.harness import demo, experiment
    from workbench.models import load

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded")

    for module in (load, experiment, demo):
        monkeypatch.setattr(module, "load_model", never)
    gpus(0)
    status, out, err = cli(capsys, *command, "--device", "cuda")
    assert status == 2 and out == []
    assert err == ("error: cuda: not available on this machine "
                   "(torch.cuda.is_available() is False)\n")
    status, _, err = cli(capsys, *command, "--device", "gpu")
    assert status == 2 and "unknown device 'gpu'; expected one of cpu, cuda, cuda:N" in err
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda:1")
    status, _, err = cli(capsys, *command)
    assert status == 2 and err.endswith("(from WORKBENCH_DEVICE)\n")
    assert not list(runs_dir.glob("*/run.json"))


def test_the_device_reaches_load_model(capsys, monkeypatch, runs_dir, gpus):
    from workbench.core.errors import WorkbenchError as Refusal
    from workbench.harness import experiment

    asked = []

    def load(name, **kwargs):
        asked.append(kwargs.get("device"))
        raise Refusal("stop here")

    monkeypatch.setattr(experiment, "load_model", load)
    gpus(2)
    status, _, err = cli(capsys, "run", "head-overview", "--model", "smollm2", "--device",
                         "cuda:1")
    assert status == 2 and "stop here" in err and asked == ["cuda:1"]


def test_a_sweep_ignores_the_device_variable(capsys, monkeypatch, runs_dir, gpus, tmp_path):
    gpus(0)
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda:7")  # would be refused by run or record
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "s"\nexperiments = ["head-overview"]\nmodels = ["minilm"]\n')
    status, out, err = cli(capsys, "sweep", str(spec), "--dry-run")
    assert status == 0 and "WORKBENCH_DEVICE" not in err and "s: 1 cells" in "\n".join(out)
