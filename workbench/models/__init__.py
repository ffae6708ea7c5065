"""Models: the :class:`Model` type, every way of loading one, and surgery on their weights.

``base`` (the type, a leaf), ``hf`` (Hugging Face loading), ``zoo`` (the bundled models),
``cache`` (their fetched copies, and converted GGUF files), ``gguf`` (reading and
converting GGUF files), ``native`` (models built from scratch), ``checkpoints`` (trained
models in the run store), ``reference`` (what a model argument names), ``load`` (the one
dispatcher over all of them), ``adapters`` (how each model family lays out its attention
and positions), ``surgery`` (removing attention heads from the weights) and
``head_permutation`` (permuting them).
"""

from workbench.core.options import Dtype
from workbench.models.base import DTYPES, Model, ModelInfo
from workbench.models.hf import wrap_hf_model
from workbench.models.load import load_model

__all__ = ["DTYPES", "Dtype", "Model", "ModelInfo", "load_model", "wrap_hf_model"]
