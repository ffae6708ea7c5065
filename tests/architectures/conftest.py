"""Tiny random models of every family in the matrix, saved once per session as local folders.

Each family's model is built from its config class (``families.py``: 2 layers, 4 heads,
d_model 32, the 300-token tokenizer of ``tests/tiny.py``), saved as a Hugging Face folder
and loaded through ``load_model`` as a user's folder would be; built, saved and loaded at
most once per session, and only for the families a selected test asks for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests import tiny
from tests.architectures.families import ENCODERS, build
from workbench.models.base import Model


class Families:
    """Lazily built folders and loaded models, one per family."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._tokenizers: dict[bool, object] = {}
        self._folders: dict[str, Path] = {}
        self._models: dict[str, Model] = {}

    def tokenizer(self, family: str):
        bert = family in ENCODERS
        if bert not in self._tokenizers:
            self._tokenizers[bert] = tiny.tiny_tokenizer(self.root / f"tokenizer-{bert}",
                                                         bert=bert)
        return self._tokenizers[bert]

    def folder(self, family: str) -> Path:
        if family not in self._folders:
            tokenizer = self.tokenizer(family)
            self._folders[family] = tiny.save_folder(build(family, len(tokenizer)), tokenizer,
                                                     self.root / family)
        return self._folders[family]

    def model(self, family: str) -> Model:
        from workbench.models.load import load_model

        if family not in self._models:
            self._models[family] = load_model(str(self.folder(family)))
        return self._models[family]


@pytest.fixture(scope="session")
def families(tmp_path_factory) -> Families:
    return Families(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: these models are tiny, and on a busy 2-core machine two threads
    spend far longer synchronising than computing (measured: about 10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
