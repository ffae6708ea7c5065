"""Session-wide fixtures: tiny random models (unit tests) and an isolated workbench home."""

from __future__ import annotations

import os
import signal

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads it when it is first imported, and the tiny models' imports bring triton
    # in (where installed): set here, before them, so that tests/unit/test_fused.py runs
    # the fused kernels under Triton's interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests import tiny

_BASELINE = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
"""SIGINT and SIGTERM as a fresh Python process has them (Ctrl-C raises KeyboardInterrupt,
SIGTERM ends the process), whatever the suite was started with: a suite started as a
background job of a non-interactive shell inherits SIGINT ignored."""


def _restore_baseline() -> None:
    for signum, handler in _BASELINE.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _signal_handlers():
    """Each test starts and ends with SIGINT and SIGTERM as a fresh process has them: a
    test or fixture that changes one (Ray's ``init`` takes SIGTERM over, a command under
    test installs its own, something ignores SIGINT) must not decide how a later test, or
    a process it starts, is interrupted. An ignored SIGINT is inherited by every
    child process, Ray's workers too, whose cells then cannot be cancelled."""
    _restore_baseline()
    yield
    _restore_baseline()


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    return tiny.tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def bert_tokenizer(tmp_path_factory):
    return tiny.tiny_tokenizer(tmp_path_factory.mktemp("bert-tokenizer"), bert=True)


@pytest.fixture(scope="session")
def llama_hf(tokenizer):
    return tiny.tiny_llama_hf(len(tokenizer))


@pytest.fixture(scope="session")
def bert_hf(tokenizer):
    return tiny.tiny_bert_hf(len(tokenizer))


@pytest.fixture(scope="session")
def llama(llama_hf, tokenizer):
    """A workbench Model over a tiny random grouped-query Llama."""
    return tiny.wrap(llama_hf, tokenizer, "tiny-llama")


@pytest.fixture(scope="session")
def bert(bert_hf, bert_tokenizer):
    """A workbench Model over a tiny random BERT."""
    return tiny.wrap(bert_hf, bert_tokenizer, "tiny-bert", has_lm_head=False)


@pytest.fixture(scope="session")
def llama_folder(llama_hf, tokenizer, tmp_path_factory):
    """The tiny Llama saved as a local Hugging Face folder (a valid MODEL argument)."""
    return tiny.save_folder(llama_hf, tokenizer, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def stocked(tmp_path_factory, llama):
    """A run store with a complete run of every kind the dashboard shows, beside damaged,
    wrong-kind and symlinked runs and a secret run outside it (built once: the dashboard's
    robustness and fuzz tests only read it)."""
    from tests.dashboard_runs import stocked_store

    return stocked_store(tmp_path_factory.mktemp("stocked"), llama)


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """An empty run store, also set as WORKBENCH_RUNS_DIR."""
    path = tmp_path / "runs"
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", str(path))
    return path


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = str(item.fspath).split(os.sep)
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "browser" in parts:
            item.add_marker(pytest.mark.browser)
