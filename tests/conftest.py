"""Session-wide fixtures: tiny random models (unit tests) and an isolated workbench home."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from tests import tiny


@contextlib.contextmanager
def _signals_kept():
    """Put SIGINT and SIGTERM back as they were before the block."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _signal_handlers():
    """Each test leaves SIGINT and SIGTERM as it found them: a test in this process that
    changes one (a command under test installs its own) must not decide how a later test
    is interrupted."""
    with _signals_kept():
        yield


@pytest.fixture(autouse=True, scope="module")
def _signal_handlers_of_the_module():
    """The same around a module's fixtures (a module-wide ``ray.init`` takes SIGTERM over
    before its first test starts and after its last ends)."""
    with _signals_kept():
        yield


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
