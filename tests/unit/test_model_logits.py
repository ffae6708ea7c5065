"""``Model.logits`` takes token ids in the forms ``encode`` gives them, and refuses text."""

from __future__ import annotations

import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.inputs.prompts import Prompt


def test_the_ids_encode_returns_give_the_logits_of_a_batch_of_one(llama, llama_hf):
    ids, _ = llama.encode(Prompt(text="the cat sat on the mat"))
    with torch.no_grad():
        reference = llama_hf(torch.tensor([ids])).logits  # Hugging Face itself
        from_list = llama.logits(ids)
        from_row = llama.logits(torch.tensor(ids))
        from_batch = llama.logits(torch.tensor([ids, ids]))
    assert from_list.shape == (1, len(ids), llama.info.d_vocab)
    torch.testing.assert_close(from_list, reference, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(from_row, from_list)
    torch.testing.assert_close(from_batch[1:], from_list)


@pytest.mark.parametrize("bad, message", [
    ("the cat", "not text: encode the text first"),
    (["the", "cat"], "not text"),
    ([[1, 2, 3], [4]], "equal length"),
    (torch.tensor([[0.5, 1.0]]), "integer token ids"),
    (torch.zeros(1, 2, 3, dtype=torch.long), "integer token ids of shape"),
    ([-1, 2], "token ids must be in 0 .."),
])
def test_anything_but_token_ids_is_refused_with_what_to_pass(llama, bad, message):
    with pytest.raises(WorkbenchError, match=message.replace(".", r"\.")):
        llama.logits(bad)


def test_an_id_past_the_vocabulary_is_refused(llama):
    with pytest.raises(WorkbenchError, match=f"0 .. {llama.info.d_vocab - 1}"):
        llama.logits([1, llama.info.d_vocab])
