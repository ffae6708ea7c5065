"""Tiny random configs of every model family the matrix covers (2 layers, 4 heads, d_model 32).

Each entry builds a Hugging Face model from its config class with random weights; the
conftest saves each once per session as a local folder (the route a user's model takes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers as tf

from tests.tiny import N_CTX

D, LAYERS, HEADS, FF = 32, 2, 4, 64
INIT = 0.2
"""Weight scale of the families whose position effects are weak at the default 0.02."""
SPECIAL = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3}
BUILDERS: dict[str, tuple[str, Callable[[int], Any]]] = {}
"""family -> (model class name, vocab -> config)."""


def family(name: str, cls: str) -> Callable[[Callable[[int], Any]], Callable[[int], Any]]:
    def wrap(fn: Callable[[int], Any]) -> Callable[[int], Any]:
        BUILDERS[name] = (cls, fn)
        return fn
    return wrap


def _llama_like(cfg_cls: Any, vocab: int, **extra: Any) -> Any:
    base = {"vocab_size": vocab, "hidden_size": D, "intermediate_size": FF,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": 2, "max_position_embeddings": N_CTX, **SPECIAL}
    return cfg_cls(**{**base, **extra})


@family("gpt2", "GPT2LMHeadModel")
def _gpt2(v: int) -> Any:
    return tf.GPT2Config(vocab_size=v, n_embd=D, n_layer=LAYERS, n_head=HEADS,
                         n_positions=N_CTX, n_inner=FF, **SPECIAL)


@family("gpt-neox", "GPTNeoXForCausalLM")
def _neox(v: int) -> Any:
    return tf.GPTNeoXConfig(vocab_size=v, hidden_size=D, num_hidden_layers=LAYERS,
                            num_attention_heads=HEADS, intermediate_size=FF, rotary_pct=0.25,
                            max_position_embeddings=N_CTX, **SPECIAL)


@family("opt", "OPTForCausalLM")
def _opt(v: int) -> Any:
    return tf.OPTConfig(vocab_size=v, hidden_size=D, num_hidden_layers=LAYERS, ffn_dim=FF,
                        num_attention_heads=HEADS, word_embed_proj_dim=D,
                        max_position_embeddings=N_CTX, **SPECIAL)


@family("gpt-j", "GPTJForCausalLM")
def _gptj(v: int) -> Any:
    return tf.GPTJConfig(vocab_size=v, n_embd=D, n_layer=LAYERS, n_head=HEADS, rotary_dim=4,
                         n_positions=N_CTX, n_inner=FF, **SPECIAL)


@family("bloom", "BloomForCausalLM")
def _bloom(v: int) -> Any:
    return tf.BloomConfig(vocab_size=v, hidden_size=D, n_layer=LAYERS, n_head=HEADS,
                          initializer_range=INIT, **SPECIAL)


@family("phi", "PhiForCausalLM")
def _phi(v: int) -> Any:
    return tf.PhiConfig(vocab_size=v, hidden_size=D, intermediate_size=FF,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        partial_rotary_factor=0.5, max_position_embeddings=N_CTX, **SPECIAL)


@family("phi-3", "Phi3ForCausalLM")
def _phi3(v: int) -> Any:
    return _llama_like(tf.Phi3Config, v, original_max_position_embeddings=N_CTX)


@family("gpt-neo", "GPTNeoForCausalLM")
def _neo(v: int) -> Any:
    return tf.GPTNeoConfig(vocab_size=v, hidden_size=D, num_layers=LAYERS, num_heads=HEADS,
                           attention_types=[[["global", "local"], 1]], window_size=8,
                           intermediate_size=FF, max_position_embeddings=N_CTX, **SPECIAL)


@family("falcon", "FalconForCausalLM")
def _falcon(v: int) -> Any:
    return tf.FalconConfig(vocab_size=v, hidden_size=D, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, max_position_embeddings=N_CTX,
                           **SPECIAL)


@family("gpt-bigcode", "GPTBigCodeForCausalLM")
def _bigcode(v: int) -> Any:
    return tf.GPTBigCodeConfig(vocab_size=v, n_embd=D, n_layer=LAYERS, n_head=HEADS,
                               n_inner=FF, n_positions=N_CTX, multi_query=True, **SPECIAL)


@family("stablelm", "StableLmForCausalLM")
def _stablelm(v: int) -> Any:
    return _llama_like(tf.StableLmConfig, v, partial_rotary_factor=0.25)


@family("olmo-2", "Olmo2ForCausalLM")
def _olmo2(v: int) -> Any:
    return _llama_like(tf.Olmo2Config, v)


@family("mixtral", "MixtralForCausalLM")
def _mixtral(v: int) -> Any:
    return _llama_like(tf.MixtralConfig, v, num_local_experts=2, num_experts_per_tok=1)


@family("qwen2", "Qwen2ForCausalLM")
def _qwen2(v: int) -> Any:
    return _llama_like(tf.Qwen2Config, v)


@family("qwen3", "Qwen3ForCausalLM")
def _qwen3(v: int) -> Any:
    return _llama_like(tf.Qwen3Config, v, head_dim=16)  # not hidden / heads: as in Qwen3


@family("gemma-2", "Gemma2ForCausalLM")
def _gemma2(v: int) -> Any:
    return _llama_like(tf.Gemma2Config, v, head_dim=8, sliding_window=8)


LONG_CONTEXT = 32768
"""The context of the tiny Gemma 3: Gemma 3 270M's, for the long-context measurements."""


def gemma3_config(vocab: int, **changes: Any) -> Any:
    """A tiny Gemma 3 with Gemma 3's long context: sliding-window and global layers, one
    key-value head for every query head, q/k norms, 32,768 positions (``changes`` set
    other fields: ``benchmarks/long_context.py`` takes 270M's window and head size)."""
    return _llama_like(tf.Gemma3TextConfig, vocab, **{
        "head_dim": 8, "sliding_window": 8, "num_key_value_heads": 1,
        "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": LONG_CONTEXT, **changes})


@family("gemma-3", "Gemma3ForCausalLM")
def _gemma3(v: int) -> Any:
    return gemma3_config(v)


@family("mistral", "MistralForCausalLM")
def _mistral(v: int) -> Any:
    return _llama_like(tf.MistralConfig, v, sliding_window=None)


@family("llama", "LlamaForCausalLM")
def _llama(v: int) -> Any:
    return _llama_like(tf.LlamaConfig, v)


@family("starcoder2", "Starcoder2ForCausalLM")
def _starcoder2(v: int) -> Any:
    return _llama_like(tf.Starcoder2Config, v, sliding_window=None)


@family("bert", "BertForMaskedLM")
def _bert(v: int) -> Any:
    return tf.BertConfig(vocab_size=v, hidden_size=D, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, intermediate_size=FF,
                         max_position_embeddings=N_CTX, pad_token_id=3)


@family("roberta", "RobertaForMaskedLM")
def _roberta(v: int) -> Any:
    # RoBERTa's positions start after the padding index: room for N_CTX tokens
    return tf.RobertaConfig(vocab_size=v, hidden_size=D, num_hidden_layers=LAYERS,
                            num_attention_heads=HEADS, intermediate_size=FF,
                            max_position_embeddings=N_CTX + 4, pad_token_id=3)


@family("t5", "T5ForConditionalGeneration")
def _t5(v: int) -> Any:
    return tf.T5Config(vocab_size=v, d_model=D, d_kv=8, d_ff=FF, num_layers=LAYERS,
                       num_heads=HEADS, decoder_start_token_id=3, **SPECIAL)


@family("mamba", "MambaForCausalLM")
def _mamba(v: int) -> Any:
    return tf.MambaConfig(vocab_size=v, hidden_size=D, num_hidden_layers=LAYERS,
                          state_size=4, **SPECIAL)


ENCODERS = ("bert", "roberta")


def build(name: str, vocab: int, seed: int = 0) -> torch.nn.Module:
    """The tiny random model of ``name`` (eager attention, eval mode)."""
    cls_name, make = BUILDERS[name]
    return instantiate(cls_name, make(vocab), seed)


def instantiate(cls_name: str, cfg: Any, seed: int = 0) -> torch.nn.Module:
    """A random model of class ``cls_name`` from ``cfg`` (eager attention, eval mode)."""
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return getattr(tf, cls_name)(cfg).eval()
