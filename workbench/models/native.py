"""Small transformers built from scratch: TransformerLens' native model behind a bridge.

:class:`ModelSpec` describes a TL-native model (``TransformerBridge.boot_native``):
attention-only or with MLPs, any number of layers, learned or rotary positions. Its seed
fixes the initial weights. :func:`build_bridge` builds one, :func:`as_model` wraps it as a
:class:`~workbench.models.base.Model`, and :func:`load_tokenizer` reads the tokenizer a
trained run saved; the training loop is :mod:`workbench.training`.

Examples:
    >>> spec = ModelSpec(n_layers=2, d_model=64, n_heads=4, n_ctx=128, d_vocab=2048)
    >>> bridge = build_bridge(spec, tokenizer)                        # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from workbench.core.options import Dtype
from workbench.models.base import DTYPES, Model, ModelInfo

Positions = Literal["learned", "rotary"]
ARCHITECTURE = "TransformerLensNative"


@dataclass(frozen=True)
class ModelSpec:
    """A TL-native transformer: shape, positions, MLPs or not, and the init seed."""

    n_layers: int
    d_model: int
    n_heads: int
    n_ctx: int
    d_vocab: int
    attn_only: bool = True
    d_mlp: int | None = None
    positions: Positions = "learned"
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.n_layers, self.d_model, self.n_heads, self.n_ctx, self.d_vocab) < 1:
            raise ValueError("n_layers, d_model, n_heads, n_ctx and d_vocab must be positive")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads "
                             f"{self.n_heads}")
        if self.positions not in ("learned", "rotary"):
            raise ValueError(f"positions must be 'learned' or 'rotary', got {self.positions!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def bridge_config(self) -> Any:
        """The ``TransformerBridgeConfig`` that ``boot_native`` builds this model from."""
        from transformer_lens.config import TransformerBridgeConfig

        return TransformerBridgeConfig(
            d_model=self.d_model, d_head=self.d_head, n_heads=self.n_heads,
            n_layers=self.n_layers, n_ctx=self.n_ctx, d_vocab=self.d_vocab,
            attn_only=self.attn_only, d_mlp=None if self.attn_only else self.d_mlp,
            act_fn="gelu", normalization_type="LN", seed=self.seed, init_mode="gpt2",
            positional_embedding_type="rotary" if self.positions == "rotary" else "standard",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        return cls(**data)


def build_bridge(spec: ModelSpec, tokenizer: Any, *, dtype: Dtype = "float32",
                 device: str = "cpu") -> Any:
    """A freshly initialised TL-native model behind a ``TransformerBridge``.

    The weights depend only on ``spec`` (its seed is TransformerLens' init seed, drawn
    from a private generator), never on the global RNG.
    """
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.model_bridge.sources import native  # noqa: F401 (boot_native)

    with warnings.catch_warnings(), contextlib.redirect_stdout(None):
        warnings.simplefilter("ignore")
        # boot_native is attached to the class when its source module is imported
        bridge = TransformerBridge.boot_native(  # pyright: ignore[reportAttributeAccessIssue]
            spec.bridge_config(), tokenizer=tokenizer, device=device, dtype=DTYPES[dtype],
            model_name=f"native-L{spec.n_layers}")
    return bridge


def as_model(bridge: Any, tokenizer: Any, spec: ModelSpec, *, name: str,
             source: str = "trained in memory", checksum: str = "",
             dtype: Dtype = "float32") -> Model:
    """Wrap a native bridge as a workbench :class:`Model` (causal, with a trained head)."""
    info = ModelInfo(
        name=name, source=source, checksum=checksum, architecture=ARCHITECTURE,
        n_layers=spec.n_layers, n_heads=spec.n_heads, n_kv_heads=spec.n_heads,
        d_model=spec.d_model, d_head=spec.d_head, n_ctx=spec.n_ctx, d_vocab=spec.d_vocab,
        positions=spec.positions, causal=True, has_lm_head=True,
        bos_token_id=tokenizer.bos_token_id, dtype=dtype,
        layer_types=("global",) * spec.n_layers, sliding_window=None,
    )
    return Model(bridge, tokenizer, info)


def load_tokenizer(folder: str | Path) -> Any:
    """A tokenizer saved by :func:`workbench.training.data.train_tokenizer`."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))
