"""The model type every layer above shares: a bridge, its tokenizer and the facts about it.

:class:`Model` wraps a TransformerLens ``TransformerBridge``; :class:`ModelInfo` says what
the model is, where it came from and what it may honestly be used for. This module imports
nothing else of :mod:`workbench.models`, so everything can depend on it; loading lives in
:mod:`workbench.models.load` (the dispatcher), :mod:`workbench.models.hf`,
:mod:`workbench.models.cache`, :mod:`workbench.models.native` and
:mod:`workbench.models.checkpoints`.

Examples:
    >>> from workbench.models import load_model
    >>> model = load_model("smollm2")                      # doctest: +SKIP
    >>> model.info.n_heads, model.info.n_kv_heads          # doctest: +SKIP
    (9, 3)
    >>> ids, _ = model.encode(Prompt(text="The capital of France is"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.inputs.batching import Batch, make_batches
from workbench.inputs.prompts import Prompt, check_length
from workbench.inputs.tokenizing import ModelFacts
from workbench.store.records import ModelInfo

FactsT = TypeVar("FactsT", bound=ModelFacts)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class Capabilities(Protocol):
    """What a model can honestly be used for: a loaded model's :class:`ModelInfo`, or what
    is known of a model before it loads (``None``: not known until it does)."""

    @property
    def name(self) -> str: ...
    @property
    def causal(self) -> bool | None: ...
    @property
    def has_lm_head(self) -> bool | None: ...


def require(facts: Capabilities, *, causal: bool | None = None, lm_head: bool | None = None,
            what: str = "this") -> None:
    """Refuse, with a reason, what a model with ``facts`` cannot honestly do; a fact that
    is not known yet (``None``) refuses nothing, so the check is repeated once it loads.

    Args:
        facts: the model's :class:`ModelInfo`, or its facts known before loading.
        causal: ``True`` when ``what`` needs a causal (left-to-right) model.
        lm_head: ``True`` when ``what`` needs a trained language-model head.
        what: what is asked, for the message.

    Raises:
        ModelCapabilityError: e.g. a loss asked of an encoder with no trained LM head.
    """
    name = facts.name
    if causal is True and facts.causal is False:
        raise ModelCapabilityError(f"{what} needs a causal model; {name} is bidirectional")
    if lm_head is True and facts.has_lm_head is False:
        raise ModelCapabilityError(
            f"{what} needs a trained language-model head; {name} has none "
            "(its head is randomly initialised), so no loss or prediction is reported"
        )


class Tokenizing(Generic[FactsT]):
    """A tokenizer and the facts that say how a model frames its inputs: what encodes
    prompts and batches them, with or without the weights (:class:`Model` is one; a
    tokenizer read alone, :func:`workbench.models.load.load_tokenizing`, is another, for
    the checks made before a model loads).

    Attributes:
        tokenizer: the Hugging Face tokenizer, used without automatic BOS insertion.
        info: the model's facts (whether it is causal, its BOS, its context).
    """

    def __init__(self, tokenizer: Any, info: FactsT) -> None:
        self.tokenizer = tokenizer
        self.info = info
        self.paired_batches = False
        """:meth:`batches` keeps prompts of one length together in twos (set while a
        resample head mask is applied: :func:`workbench.interventions.masks.applied`)."""

    def encode(self, prompt: Prompt) -> tuple[list[int], list[int] | None]:
        """Token ids (and segment ids for encoder sentence pairs) of one prompt.

        Causal models get their BOS token prepended to text; encoders get the tokenizer's
        own special tokens (``[CLS] a [SEP] b [SEP]``). Pre-tokenized prompts are used as
        they are.

        Raises:
            WorkbenchError: the prompt is empty or longer than the model's context; a
                text far too long to fit is refused before it is tokenized
                (:func:`workbench.inputs.prompts.check_length`).
        """
        if prompt.token_ids is not None:
            ids, type_ids = list(prompt.token_ids), None
        else:
            ids, type_ids = self._tokenize(prompt)
        if not ids:
            raise WorkbenchError("prompt has no tokens")
        if len(ids) > self.info.n_ctx:
            raise WorkbenchError(
                f"prompt {prompt.label or ''} has {len(ids)} tokens; "
                f"{self.info.name} has a context of {self.info.n_ctx}".replace("  ", " ")
            )
        return ids, type_ids

    def _tokenize(self, prompt: Prompt) -> tuple[list[int], list[int] | None]:
        if not (prompt.text or "").strip():
            raise WorkbenchError(f"prompt {prompt.label or ''} is empty".replace("  ", " "))
        check_length(prompt, self.info.n_ctx, self.info.name)  # before the tokenizer's work
        if self.info.causal:
            ids = self.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
            if self.info.bos_token_id is not None:
                ids = [self.info.bos_token_id, *ids]
            return ids, None
        enc = self.tokenizer(prompt.text, prompt.pair, add_special_tokens=True)
        return enc["input_ids"], enc.get("token_type_ids")

    @property
    def pad_id(self) -> int:
        """The id right-padded batches are filled with (never attended to)."""
        return self.tokenizer.pad_token_id or 0

    def batches(self, prompts: Sequence[Prompt], *, max_tokens: int = 2048) -> list[Batch]:
        """Encode ``prompts`` and group them into right-padded batches of at most
        ``max_tokens`` tokens each (see :mod:`workbench.inputs.batching`; while a resample
        mask is applied, prompts of one length are kept together in twos, over
        ``max_tokens`` where two prompts exceed it: :attr:`paired_batches`).

        Raises:
            WorkbenchError: a prompt is empty or longer than the context (see :meth:`encode`).
        """
        encoded = [self.encode(p) for p in prompts]
        return list(make_batches(encoded, pad_id=self.pad_id, max_tokens=max_tokens,
                                 paired=self.paired_batches))

    def frame(self, ids: list[int]) -> list[int]:
        """Content token ids framed as the model expects: ``[BOS] ...`` for causal models,
        ``[CLS] ... [SEP]`` for encoders."""
        if self.info.causal:
            bos = self.info.bos_token_id
            return list(ids) if bos is None else [bos, *ids]
        return [self.tokenizer.cls_token_id, *ids, self.tokenizer.sep_token_id]

    def str_tokens(self, ids: list[int] | Tensor) -> list[str]:
        """Readable token strings (``Ġ`` and ``▁`` word markers shown as spaces)."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        toks = self.tokenizer.convert_ids_to_tokens(ids)
        return [_readable(t) for t in toks]


class Model(Tokenizing[ModelInfo]):
    """A bridge, its tokenizer, and the facts about the model.

    Attributes:
        bridge: the ``TransformerBridge``; hook it with ``bridge.hooks(fwd_hooks=...)``.
        tokenizer: the Hugging Face tokenizer, used without automatic BOS insertion.
        info: see :class:`ModelInfo`.
    """

    def __init__(self, bridge: Any, tokenizer: Any, info: ModelInfo) -> None:
        super().__init__(tokenizer, info)
        self.bridge = bridge

    def __repr__(self) -> str:
        i = self.info
        return (f"Model({i.name!r}, {i.architecture}, layers={i.n_layers}, "
                f"heads={i.n_heads}/{i.n_kv_heads}, d_model={i.d_model})")

    def require(self, *, causal: bool | None = None, lm_head: bool | None = None,
                what: str = "this") -> None:
        """Refuse, with a reason, what this model cannot honestly do (see :func:`require`).

        Raises:
            ModelCapabilityError: e.g. a loss asked of an encoder with no trained LM head.
        """
        require(self.info, causal=causal, lm_head=lm_head, what=what)

    def logits(self, input_ids: Int[Tensor, "batch pos"] | Int[Tensor, " pos"] | Sequence[int]
               | Sequence[Sequence[int]],
               attention_mask: Int[Tensor, "batch pos"] | None = None
               ) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits of a causal LM (refused for models without a trained head).

        Args:
            input_ids: token ids: a ``[batch, pos]`` tensor, or one prompt's ids as
                :meth:`encode` returns them (a list or a ``[pos]`` tensor, run as a batch
                of one), or a list of equal-length lists.
            attention_mask: ``[batch, pos]``, 1 for real tokens (for right-padded batches).

        Returns:
            ``[batch, pos, d_vocab]`` logits.

        Raises:
            WorkbenchError: text, ragged lists or ids outside the vocabulary (the message
                says what to pass instead).
        """
        self.require(lm_head=True, what="logits")
        return self.bridge(self._token_tensor(input_ids), attention_mask=attention_mask)

    def _token_tensor(self, input_ids: Any) -> Int[Tensor, "batch pos"]:
        """``input_ids`` as a ``[batch, pos]`` tensor of ids in the vocabulary."""
        if isinstance(input_ids, str) or (
                isinstance(input_ids, Sequence) and any(isinstance(x, str) for x in input_ids)):
            raise WorkbenchError("logits takes token ids, not text: encode the text first, "
                                 "ids, _ = model.encode(Prompt(text=...))")
        try:
            ids = input_ids if isinstance(input_ids, Tensor) else torch.tensor(input_ids)
        except (TypeError, ValueError) as exc:
            raise WorkbenchError(f"logits takes token ids (a [batch, pos] tensor or lists of "
                                 f"equal length; model.batches pads prompts): {exc}") from None
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dim() not in (1, 2):
            raise WorkbenchError(f"logits takes integer token ids of shape [pos] or [batch, "
                                 f"pos], got {ids.dtype} of shape {tuple(ids.shape)}")
        if ids.numel() and not (int(ids.min()) >= 0 and int(ids.max()) < self.info.d_vocab):
            raise WorkbenchError(f"token ids must be in 0 .. {self.info.d_vocab - 1} (the "
                                 f"vocabulary of {self.info.name})")
        return ids[None] if ids.dim() == 1 else ids


def _readable(token: str) -> str:
    return token.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\n").replace("ĉ", "\t")
