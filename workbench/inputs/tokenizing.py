"""What building inputs needs of a model: its tokenizer, how it frames ids, a few facts.

The input builders (prompt sets, random and repeated tokens, corpora, sentences, token
types, IOI prompts) take a model as an argument. They are typed against
:class:`TokenizingModel`, not :class:`workbench.models.base.Model`, so that this layer
names nothing of the layer above it: a loaded ``Model`` meets the protocol, and so does
any stand-in that tokenizes (a test's, a tokenizer-only tool's).

Examples:
    >>> from workbench.inputs.prompts import content_token_range
    >>> content_token_range(model)  # a Model, or anything that tokenizes  # doctest: +SKIP
    (4, 49152)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from workbench.inputs.prompts import Prompt


class ModelFacts(Protocol):
    """The facts of a model (its ``ModelInfo``) that the input builders read."""

    @property
    def name(self) -> str: ...
    @property
    def causal(self) -> bool | None: ...
    @property
    def bos_token_id(self) -> int | None: ...
    @property
    def n_ctx(self) -> int: ...


class TokenizingModel(Protocol):
    """What the input builders call on a model.

    Attributes:
        tokenizer: the Hugging Face tokenizer, used without automatic BOS insertion.
        info: the model's facts (:class:`ModelFacts`).
    """

    tokenizer: Any

    @property
    def info(self) -> ModelFacts: ...

    def encode(self, prompt: Prompt) -> tuple[list[int], list[int] | None]:
        """A prompt's token ids as the model runs them, and its segment ids (or ``None``)."""
        ...

    def frame(self, ids: list[int]) -> list[int]:
        """Content ids framed with the model's special tokens (``[BOS] ...`` or
        ``[CLS] ... [SEP]``)."""
        ...

    def str_tokens(self, ids: list[int] | Tensor) -> list[str]:
        """Readable token strings."""
        ...
