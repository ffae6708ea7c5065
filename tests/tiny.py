"""Tiny random models for unit tests: offline, deterministic, and fast on a CPU."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertForMaskedLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from workbench.models.base import Model
from workbench.models.hf import wrap_hf_model
from workbench.store.records import ModelInfo

CORPUS = [
    "the cat sat on the mat and the dog sat on the rug",
    "a quick brown fox jumps over the lazy dog by the river",
    "bread is made from flour water salt and yeast",
    "the committee met on tuesday to discuss the budget",
] * 8
N_CTX = 512


def fake_info(name: str = "tiny", checksum: str = "abc", **changes) -> ModelInfo:
    """The record of a model that was never loaded, for tests of the run store."""
    fields = dict(name=name, source="test", checksum=checksum, architecture="LlamaForCausalLM",
                  n_layers=2, n_heads=4, n_kv_heads=4, d_model=32, d_head=8, n_ctx=N_CTX,
                  d_vocab=300, positions="rotary", causal=True, has_lm_head=True,
                  bos_token_id=0, dtype="float32")
    return ModelInfo(**{**fields, **changes})


def tiny_tokenizer(folder: Path, bert: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with 300 tokens, saved in ``folder``.

    With ``bert=True`` it frames inputs as ``[CLS] a [SEP] b [SEP]`` with segment ids.
    """
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<bos>", "<eos>", "<unk>", "<pad>", "[CLS]", "[SEP]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tk.train_from_iterator(CORPUS, trainer)
    if bert:
        cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
        tk.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>", pad_token="<pad>", cls_token="[CLS]",
                                  sep_token="[SEP]")
    tok.save_pretrained(str(folder))
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def tiny_llama_hf(vocab: int, seed: int = 0) -> LlamaForCausalLM:
    """2 layers, 4 query heads sharing 2 key-value heads (grouped-query), d_model 32."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=N_CTX, bos_token_id=0, eos_token_id=1,
                      pad_token_id=3, attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


def tiny_bert_hf(vocab: int, seed: int = 0) -> BertForMaskedLM:
    """2 layers, 4 heads, d_model 32, learned positions, bidirectional."""
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=N_CTX,
                     pad_token_id=3, attn_implementation="eager")
    return BertForMaskedLM(cfg).eval()


def wrap(hf_model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, name: str,
         **kwargs) -> Model:
    """A workbench model around a deep copy (the bridge rewires the module it wraps)."""
    return wrap_hf_model(copy.deepcopy(hf_model), tokenizer, name=name, **kwargs)


def save_folder(hf_model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast,
                folder: Path) -> Path:
    """Save model and tokenizer as a local Hugging Face folder."""
    hf_model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def cli(capsys, *args: str) -> tuple[int, list[str], str]:
    """Run the CLI in-process; return (exit status, stdout lines, stderr)."""
    from workbench.cli import main

    try:
        main(["--quiet", *args])
        status = 0
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out.strip().splitlines(), err


def ended_writer() -> dict[str, float]:
    """``pid`` and ``pid_started`` of a process that has ended (started, then killed and
    reaped), as a ``run.json`` records its writer. Its start time is kept, so the pid
    being reused meanwhile does not bring the writer back."""
    from workbench.store.runs import process_started

    child = subprocess.Popen(["sleep", "60"])
    started = process_started(child.pid)
    child.kill()
    child.wait()
    assert started is not None
    return {"pid": child.pid, "pid_started": started}
