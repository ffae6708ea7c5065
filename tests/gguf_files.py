"""Tiny GGUF files written with the ``gguf`` package's writer, as llama.cpp lays them out.

A tiny random Hugging Face model is written under llama.cpp's tensor names (the ``gguf``
package's own name map), with the transforms llama.cpp applies that ``transformers`` undoes
on loading (Llama's q/k rows permuted for its rotary layout, Gemma's norms stored as
``1 + weight``), so that a GGUF loads back as the very model it was written from: the
reference a test compares the dequantized model with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
import transformers as tf

D, HEADS, HEAD_DIM, FF, N_CTX = 32, 4, 8, 64, 64
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]
WORDS = ["▁the", "▁cat", "▁sat", "▁on", "▁mat", "▁capital", "▁of", "▁France", "▁is", "▁Paris"]
TOKENS = [*SPECIAL, "▁", *"abcdefghijklmnopqrstuvwxyzCFP", *WORDS]
"""A sentencepiece vocabulary: special tokens, single characters, a few whole words."""


def tiny_llama() -> Any:
    config = tf.LlamaConfig(vocab_size=len(TOKENS), hidden_size=D, intermediate_size=FF,
                            num_hidden_layers=2, num_attention_heads=HEADS,
                            num_key_value_heads=2, head_dim=HEAD_DIM, rms_norm_eps=1e-6,
                            max_position_embeddings=N_CTX, tie_word_embeddings=False,
                            rope_theta=10000.0, pad_token_id=0, eos_token_id=1,
                            bos_token_id=2)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(config).eval()


def tiny_gemma3(window: int = 8) -> Any:
    """Six layers, so that the sixth is global and the others slide (Gemma 3's pattern,
    which a GGUF does not store: ``transformers`` rebuilds it)."""
    config = tf.Gemma3TextConfig(vocab_size=len(TOKENS), hidden_size=D, intermediate_size=FF,
                                 num_hidden_layers=6, num_attention_heads=HEADS,
                                 num_key_value_heads=1, head_dim=HEAD_DIM, rms_norm_eps=1e-6,
                                 sliding_window=window, max_position_embeddings=N_CTX,
                                 rope_theta=1e6, pad_token_id=0, eos_token_id=1,
                                 bos_token_id=2)
    torch.manual_seed(0)
    model = tf.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # Gemma's norms start at zero weight (scale 1); make them matter
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0, 0.2)
    return model


def _permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's row order of a Llama q or k projection (the inverse of transformers')."""
    rows = weight.shape[0]
    return (weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _tensors(model: Any, arch: str) -> dict[str, np.ndarray]:
    """The model's weights under llama.cpp's names, as llama.cpp stores them."""
    cfg = model.config
    archs = {gguf.MODEL_ARCH_NAMES[a]: a for a in gguf.MODEL_ARCH_NAMES}
    names = gguf.get_tensor_name_map(archs[arch], cfg.num_hidden_layers)
    out: dict[str, np.ndarray] = {}
    for hf_name, tensor in model.state_dict().items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise KeyError(f"no GGUF name for {hf_name}")
        weight = tensor.float().numpy()
        if arch == "llama" and ".attn_q." in name:
            weight = _permute(weight, cfg.num_attention_heads)
        elif arch == "llama" and ".attn_k." in name:
            weight = _permute(weight, cfg.num_key_value_heads)
        elif arch == "gemma3" and "norm.weight" in name:
            weight = weight + 1
        out[name] = np.ascontiguousarray(weight, dtype=np.float32)
    return out


def write(model: Any, path: Path, arch: str | None = None) -> Path:
    """Write ``model`` (:func:`tiny_llama` or :func:`tiny_gemma3`) as a GGUF file.

    Args:
        arch: the ``general.architecture`` to write (default: the model's own, ``llama``
            or ``gemma3``); another one writes a file of that name with the same contents.
    """
    cfg = model.config
    own = "gemma3" if cfg.model_type.startswith("gemma3") else "llama"
    name = arch or own
    writer = gguf.GGUFWriter(str(path), name)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(D)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    if own == "gemma3":
        writer.add_rope_freq_base(1e6)
        writer.add_sliding_window(cfg.sliding_window)
    else:
        writer.add_rope_freq_base(10000.0)
        writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * len(SPECIAL) + [-float(i) for i in range(len(TOKENS)
                                                                               - len(SPECIAL))])
    writer.add_token_types([3] * len(SPECIAL) + [1] * (len(TOKENS) - len(SPECIAL)))
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_bos_token_id(2)
    writer.add_unk_token_id(3)
    for tensor_name, weight in _tensors(model, own).items():
        writer.add_tensor(tensor_name, weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
