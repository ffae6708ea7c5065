"""The real bundled models, fetched on first use (``make test`` fetches them first)."""

from __future__ import annotations

import pytest

from workbench.models.load import load_model


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2")


@pytest.fixture(scope="session")
def minilm():
    return load_model("minilm")


@pytest.fixture(scope="session")
def gemma3():
    return load_model("gemma3")
