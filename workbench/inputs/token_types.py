"""Token types: what kind of token sits at each position, to say where attention lands.

Seven exclusive types, in this order of precedence (a token takes the first that fits), so
shares of attention summed over the types cover every key exactly once:

- ``bos``, ``cls``, ``sep``: the model's own special tokens, by id (``bos`` only for causal
  models that prepend one, ``cls`` and ``sep`` only for encoders);
- ``first_content``: the first non-special token of a prompt (where the sink moves when a
  causal model sees no BOS; Gu et al. 2024, "When Attention Sink Emerges in Language
  Models", section 3);
- ``newline``: a token that contains a line break;
- ``punctuation``: a token made only of Unicode punctuation (after stripping white space);
- ``other``: everything else, other special tokens included.

Newlines and punctuation are the delimiters that Clark et al. 2019 ("What Does BERT Look
At?", section 3.2) and Sun et al. 2024 ("Massive Activations in Large Language Models",
section 2) find attention and massive activations concentrated on.

Examples:
    >>> is_punctuation(" ."), is_punctuation("a."), is_delimiter("\\n")
    (True, False, True)
    >>> typer = TokenTyper.for_model(model)                      # doctest: +SKIP
    >>> typer.names(model.encode(Prompt(text="Hi.\\nYes"))[0])    # doctest: +SKIP
    ['bos', 'first_content', 'punctuation', 'newline', 'other']
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from jaxtyping import Bool, Int
from torch import Tensor

if TYPE_CHECKING:
    from workbench.inputs.tokenizing import TokenizingModel

TokenType = Literal["bos", "cls", "sep", "first_content", "newline", "punctuation", "other"]
TOKEN_TYPES: tuple[TokenType, ...] = (
    "bos", "cls", "sep", "first_content", "newline", "punctuation", "other")
PADDED = -1
"""The type code of a padded position."""


def is_punctuation(token: str) -> bool:
    """True when ``token``, stripped of white space, is only Unicode punctuation."""
    text = token.strip()
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def is_delimiter(token: str) -> bool:
    """True for a newline or punctuation token (see the module docstring)."""
    return "\n" in token or is_punctuation(token)


def token_type_table(model: TokenizingModel) -> Int[Tensor, " d_vocab"]:
    """The position-independent type code (index into ``TOKEN_TYPES``) of every token id.

    ``first_content`` depends on the position, so it is never in the table; see
    :meth:`TokenTyper.codes`.
    """
    tok = model.tokenizer
    strings = model.str_tokens(list(range(len(tok))))
    codes = torch.full((len(strings),), TOKEN_TYPES.index("other"), dtype=torch.long)
    for i, text in enumerate(strings):
        if "\n" in text:
            codes[i] = TOKEN_TYPES.index("newline")
        elif is_punctuation(text):
            codes[i] = TOKEN_TYPES.index("punctuation")
    for special in tok.all_special_ids:
        codes[special] = TOKEN_TYPES.index("other")
    causal = model.info.causal
    named = {"bos": model.info.bos_token_id if causal else None,
             "cls": None if causal else tok.cls_token_id,
             "sep": None if causal else tok.sep_token_id}
    for name, token_id in named.items():
        if token_id is not None:
            codes[token_id] = TOKEN_TYPES.index(name)
    return codes


def model_token_types(model: TokenizingModel) -> list[TokenType]:
    """The token types that can occur for this model (no [CLS] in a decoder, no BOS in
    BERT, no BOS in a decoder that prepends none)."""
    drop = {"cls", "sep"} if model.info.causal else {"bos"}
    if model.info.causal and model.info.bos_token_id is None:
        drop.add("bos")
    return [t for t in TOKEN_TYPES if t not in drop]


@dataclass(frozen=True)
class TokenTyper:
    """The type codes of a model's tokens, for whole batches at once.

    Attributes:
        table: :func:`token_type_table` of the model.
        special: which token ids are special tokens (never ``first_content``).
    """

    table: Int[Tensor, " d_vocab"]
    special: Bool[Tensor, " d_vocab"]

    @classmethod
    def for_model(cls, model: TokenizingModel) -> TokenTyper:
        special = torch.zeros(len(model.tokenizer), dtype=torch.bool)
        special[list(model.tokenizer.all_special_ids)] = True
        return cls(token_type_table(model), special)

    def codes(self, input_ids: Int[Tensor, "batch pos"], real: Bool[Tensor, "batch pos"]
              ) -> Int[Tensor, "batch pos"]:
        """Each position's type code (index into ``TOKEN_TYPES``).

        Args:
            input_ids: right-padded token ids.
            real: which positions hold real tokens.

        Returns:
            The codes, with the first real non-special token of each row marked
            ``first_content`` and padded positions ``PADDED``.
        """
        codes = self.table[input_ids].clone()
        content = real & ~self.special[input_ids]
        first = content.float().argmax(-1)  # argmax returns the first maximum: the first 1
        rows = torch.arange(len(codes))[content.any(-1)]
        codes[rows, first[rows]] = TOKEN_TYPES.index("first_content")
        return codes.masked_fill(~real, PADDED)

    def names(self, ids: Sequence[int]) -> list[TokenType]:
        """The type of each token of one unpadded prompt, by name."""
        row = torch.tensor([list(ids)])
        codes = self.codes(row, torch.ones_like(row, dtype=torch.bool))[0]
        return [TOKEN_TYPES[int(c)] for c in codes]
