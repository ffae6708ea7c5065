"""Token types of the tiny tokenizers, checked token by token."""

from __future__ import annotations

import torch

from workbench.inputs.token_types import (
    PADDED,
    TOKEN_TYPES,
    TokenTyper,
    is_delimiter,
    is_punctuation,
    model_token_types,
    token_type_table,
)


def type_of(model, token: str) -> str:
    """The table's type of one token string of the tiny vocabulary."""
    token_id = model.tokenizer.convert_tokens_to_ids(token)
    assert token_id != model.tokenizer.unk_token_id, token
    return TOKEN_TYPES[int(token_type_table(model)[token_id])]


def test_punctuation_and_delimiters():
    for token in (".", " ,", "...", "—", "«", "?!"):
        assert is_punctuation(token), token
    for token in ("a.", " ", "", "+", "the", "1."):  # "+" is a math symbol, not punctuation
        assert not is_punctuation(token), token
    assert is_delimiter("\n") and is_delimiter(" \n\n") and is_delimiter(";")
    assert not is_delimiter("the") and not is_delimiter(" ")


def test_table_of_the_decoder(llama):
    # byte-level tokens: "Ċ" is a line break, "Ġ" a lone space
    expected = {"<bos>": "bos", "[CLS]": "other", "[SEP]": "other", "<pad>": "other",
                "<eos>": "other", ".": "punctuation", ",": "punctuation", ":": "punctuation",
                "Ċ": "newline", "the": "other", "Ġthe": "other", "Ġ": "other"}
    assert {token: type_of(llama, token) for token in expected} == expected
    assert model_token_types(llama) == ["bos", "first_content", "newline", "punctuation",
                                        "other"]


def test_table_of_the_encoder(bert):
    expected = {"<bos>": "other", "[CLS]": "cls", "[SEP]": "sep", ".": "punctuation",
                "Ċ": "newline", "the": "other"}
    assert {token: type_of(bert, token) for token in expected} == expected
    assert model_token_types(bert) == ["cls", "sep", "first_content", "newline",
                                       "punctuation", "other"]


def test_codes_mark_the_first_content_token_and_padding(llama):
    typer = TokenTyper.for_model(llama)
    the, dot, newline, space_the, bos, pad = 263, 19, 204, 264, 0, 3
    ids = torch.tensor([[bos, the, dot, newline, the], [bos, dot, space_the, pad, pad]])
    real = torch.tensor([[True] * 5, [True, True, True, False, False]])
    names = [[TOKEN_TYPES[c] if c != PADDED else "padded" for c in row]
             for row in typer.codes(ids, real).tolist()]
    assert names == [["bos", "first_content", "punctuation", "newline", "other"],
                     # first_content takes precedence over punctuation
                     ["bos", "first_content", "other", "padded", "padded"]]
    assert typer.names([the, dot]) == ["first_content", "punctuation"]  # no BOS
    assert typer.names([bos, 1]) == ["bos", "other"]  # only special tokens: no content


def test_codes_of_an_encoder_pair(bert):
    cls, sep, the, dot, newline = 4, 5, 263, 19, 204
    names = TokenTyper.for_model(bert).names([cls, the, dot, sep, newline, sep])
    assert names == ["cls", "first_content", "punctuation", "sep", "newline", "sep"]
