"""Load a Hugging Face model (a folder or a hub id) as a ``TransformerBridge``.

Every route of :func:`workbench.models.load_model` ends here: the Hugging Face model is
loaded with eager attention (so patterns can be hooked) and wrapped by TransformerLens'
``TransformerBridge.boot_transformers``; :func:`wrap_hf_model` also wraps a model built in
memory (the tests' tiny random models).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import pickle
from pathlib import Path
from typing import Any, cast

import huggingface_hub.errors
import torch
from safetensors import SafetensorError

from workbench.core import checksums
from workbench.core.errors import WorkbenchError
from workbench.core.options import Dtype
from workbench.models import adapters, quiet_norms
from workbench.models.base import DTYPES, Model, ModelInfo
from workbench.store.records import LayerType

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")
"""A local folder has at least one of these beside its config (a folder without one gave
a tokenizer of unknown tokens only)."""
SIZE_KEYS = ("num_attention_heads", "num_key_value_heads", "num_hidden_layers", "hidden_size",
             "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings",
             "n_head", "n_layer", "n_embd", "n_positions", "num_heads", "num_layers",
             "d_model")
"""The config fields that are sizes, in the spellings of the families the bridge knows."""
HARMLESS_EXTRA = (".inv_freq", ".attn.bias", ".attn.masked_bias", "position_ids")
"""Stored buffers some checkpoints carry that a model rebuilds itself: not a mismatch."""
_MAX_CONFIG_BYTES = 16 << 20
# What transformers raises on a damaged local folder: unreadable or truncated files, JSON
# that is not a config, a config that fails its own checks (huggingface_hub's strict
# dataclasses), safetensors or pickled weights that are not weights, shapes that do not
# fit the config.
_BAD_FOLDER_ERRORS = (OSError, ValueError, KeyError, EOFError, RuntimeError, SafetensorError,
                      pickle.UnpicklingError,
                      getattr(huggingface_hub.errors, "StrictDataclassError", ValueError))


def check_folder(path: Path) -> None:
    """Refuse a local model folder whose ``config.json`` is not a model config or that has
    no weights, before ``transformers`` reads it.

    Raises:
        WorkbenchError: what is wrong with the folder, and what is expected.
    """
    config = path / "config.json"
    try:
        if not config.is_file() or config.stat().st_size > _MAX_CONFIG_BYTES:
            raise WorkbenchError(f"{config} is not a config file of a sensible size")
        data = json.loads(config.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise WorkbenchError(f"cannot read {config}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise WorkbenchError(f"{config} is not UTF-8 text; expected a Hugging Face model "
                             "config (JSON)") from None
    except json.JSONDecodeError as exc:
        raise WorkbenchError(f"{config} is not valid JSON ({exc.msg} at line {exc.lineno}); "
                             "expected a Hugging Face model config") from None
    except RecursionError:
        raise WorkbenchError(f"{config} is JSON nested too deeply; expected a Hugging Face "
                             "model config") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise WorkbenchError(f"{config} is not a Hugging Face model config (no 'model_type'); "
                             "expected the config.json saved with the model")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise WorkbenchError(f"{path} has no weights; expected {' or '.join(WEIGHT_FILES[::2])} "
                             "next to config.json")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise WorkbenchError(f"{path} has no tokenizer; expected {' or '.join(TOKENIZER_FILES)} "
                             "next to config.json (save the tokenizer with the model)")
    check_sizes(data, str(config))


def check_sizes(config: dict[str, Any], where: str) -> None:
    """Refuse a config whose sizes (heads, layers, widths, ...) are not positive whole
    numbers, in one line, before a model is built from it (a head count of 0 divides by
    zero deep inside transformers).

    Raises:
        WorkbenchError: the first size that is not a positive whole number.
    """
    for part, values in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(values, dict):
            continue
        for key in SIZE_KEYS:
            value = values.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkbenchError(f"{where}: {part}{key} is {value!r}; a model's sizes must "
                                     "be positive whole numbers")


_MAX_HEADER_BYTES = 100 << 20
"""The largest safetensors header read (the format's own limit)."""
_TORCH_STARTS = (b"PK\x03\x04", *(b"\x80" + bytes([p]) for p in range(2, 6)))
"""How a ``torch.save`` file starts: a zip archive, or a pickle of protocol 2 to 5."""


def check_weights(path: Path) -> None:
    """Refuse a folder whose weight files are not weights, from their headers alone (a
    plan checks many models without reading gigabytes): a safetensors file's header must
    be a table of tensors that fits the file, a ``.bin`` file must start like one
    ``torch.save`` writes, an index must name shards that exist and pass the same checks.

    Args:
        path: a folder :func:`check_folder` accepted.

    Raises:
        WorkbenchError: the first weight file that is not one, and why.
    """
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            if name.endswith(".index.json"):
                _check_index(path, path / name)
            else:
                _check_weight_file(path / name)


def _check_weight_file(file: Path) -> None:
    try:
        with open(file, "rb") as fh:
            if file.suffix == ".safetensors":
                why = _safetensors_problem(fh, file.stat().st_size)
            else:
                why = None if fh.read(4).startswith(_TORCH_STARTS) else (
                    "it does not start like a file torch.save writes")
    except OSError as exc:
        raise WorkbenchError(f"cannot read {file}: {exc.strerror}") from None
    if why:
        raise WorkbenchError(f"{file} is not a weights file ({why}); expected the weights "
                             "saved with the model")


def _safetensors_problem(fh: Any, size: int) -> str | None:
    """Why an open safetensors file is not one (``None``: its header is a table of tensors
    whose data lies inside the file)."""
    head = fh.read(8)
    n = int.from_bytes(head, "little") if len(head) == 8 else 0
    if not 2 <= n <= min(_MAX_HEADER_BYTES, size - 8):
        return f"its header length {n} does not fit the file of {size} bytes"
    try:
        table = json.loads(fh.read(n).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return "its header is not JSON"
    if not isinstance(table, dict):
        return "its header is not a table of tensors"
    offsets = [t.get("data_offsets") if isinstance(t, dict) else None
               for k, t in table.items() if k != "__metadata__"]
    ends = [o[1] if isinstance(o, list) and len(o) == 2 else -1 for o in offsets]
    if not all(isinstance(e, int) and 0 <= e <= size - 8 - n for e in ends):
        return "a tensor in its header lies outside the file"
    return None


def _check_index(path: Path, index: Path) -> None:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkbenchError(f"cannot read {index}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise WorkbenchError(f"{index} is not a weights index (not JSON)") from None
    shards = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(shards, dict) or not shards or not all(
            isinstance(v, str) and "/" not in v and v not in ("", ".", "..")
            for v in shards.values()):
        raise WorkbenchError(f"{index} is not a weights index (no weight_map of tensors to "
                             "shard files in the folder)")
    for shard in sorted(set(shards.values())):
        if not (path / shard).is_file():
            raise WorkbenchError(f"{index} names the shard {shard}, which is not in {path}")
        _check_weight_file(path / shard)


def config_facts(src: str | Path, *, local_files_only: bool = True) -> tuple[str | None,
                                                                           int | None]:
    """The architecture and number of layers a model's config gives, read as
    ``transformers`` reads it (so a config that fails its own checks is refused here),
    without loading the weights.

    Args:
        src: a model folder, or a hub id in the local Hugging Face cache.
        local_files_only: never touch the network.

    Returns:
        ``(architecture or None, layers or None)``.

    Raises:
        WorkbenchError: the config cannot be read as a model config.
    """
    config = _read_config(src, local_files_only)
    archs = getattr(config, "architectures", None) or []
    return (archs[0] if archs and isinstance(archs[0], str) else None,
            _whole(getattr(config, "num_hidden_layers", None)))


def config_context(src: str | Path) -> int | None:
    """The context a model's config gives (``max_position_embeddings`` or GPT-2's
    ``n_positions``), without loading the weights; ``None`` where it gives neither.

    Raises:
        WorkbenchError: the config cannot be read as a model config.
    """
    config = _read_config(src, True)
    text = getattr(config, "get_text_config", lambda: config)()
    return _whole(getattr(text, "max_position_embeddings", None)
                  or getattr(text, "n_positions", None))


def config_heads(src: str | Path) -> tuple[int, int] | None:
    """The layers and query heads a model's config gives (``None`` where it does not say
    both), without loading the weights: a head mask is checked against them before the
    model loads.

    Raises:
        WorkbenchError: the config cannot be read as a model config.
    """
    config = _read_config(src, True)
    layers = _whole(getattr(config, "num_hidden_layers", None))
    heads = _whole(getattr(config, "num_attention_heads", None))
    return (layers, heads) if layers and heads else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _read_config(src: str | Path, local_files_only: bool) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(src), local_files_only=local_files_only)
    except _BAD_FOLDER_ERRORS as exc:
        said = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise WorkbenchError(f"{src} could not be read as a Hugging Face model config "
                             f"({type(exc).__name__}: {said[:300]})") from None


def folder_checksum(path: Path) -> str:
    """SHA-256 over the weight files of a folder (names and contents, in name order)."""
    weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pt"))
    digest = hashlib.sha256()
    for p in weights:
        digest.update(p.name.encode())
        digest.update(bytes.fromhex(checksums.sha256_file(p)))
    return digest.hexdigest()


def boot_folder(src: str | Path, *, name: str, source: str, checksum: str,
                dtype: Dtype = "float32", device: str = "cpu", bos_token: str | None = None,
                has_lm_head: bool | None = None, local_files_only: bool = True) -> Model:
    """Load a Hugging Face model (folder or hub id) and wrap it in a ``TransformerBridge``.

    Args:
        src: a folder with ``config.json`` or a hub id.
        bos_token: token to prepend to causal prompts; the tokenizer's BOS by default.
        has_lm_head: override the detection of an untrained (missing) LM head.
        local_files_only: never touch the network.
    """
    from transformers import AutoConfig, AutoTokenizer

    hub = {"local_files_only": local_files_only}
    try:
        config = AutoConfig.from_pretrained(str(src), **hub)
        check_sizes(config.to_dict(), str(src))
        tokenizer = AutoTokenizer.from_pretrained(str(src), **hub)
        hf_model, head_missing = _load_hf(src, config, DTYPES[dtype], device, hub)
    except WorkbenchError:
        raise
    except _BAD_FOLDER_ERRORS as exc:
        if not Path(src).is_dir():  # a hub id: the caller explains what went wrong
            raise
        said = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise WorkbenchError(f"{src} could not be loaded as a Hugging Face model "
                             f"({type(exc).__name__}: {said[:300]})") from exc
    return wrap_hf_model(
        hf_model, tokenizer, name=name, source=source, checksum=checksum, dtype=dtype,
        bos_token=bos_token,
        has_lm_head=(not head_missing) if has_lm_head is None else has_lm_head,
        bridge_name=str(src),
    )


def _load_hf(src: str | Path, config: Any, dtype: torch.dtype, device: str,
             hub: dict[str, Any]) -> tuple[Any, bool]:
    """Load the HF model with eager attention; report whether its LM head was missing."""
    from transformer_lens.model_bridge.sources.transformers import (
        determine_architecture_from_hf_config,
        get_hf_model_class_for_architecture,
    )

    try:
        architecture = determine_architecture_from_hf_config(config)
    except ValueError:
        raise WorkbenchError(
            f"{src}: architecture {getattr(config, 'architectures', None)} is not supported "
            "by TransformerLens' bridge"
        ) from None
    refuse_unsupported(architecture)
    cls = get_hf_model_class_for_architecture(architecture)
    quiet_transformers()
    # A missing head is initialised from the global RNG; seed it so loads are repeatable.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        # with output_loading_info, a (model, loading info) pair, which its annotation omits
        hf_model, loading = cast(tuple[Any, dict[str, Any]], cls.from_pretrained(
            str(src), config=config, dtype=dtype, attn_implementation="eager",
            output_loading_info=True, **hub,
        ))
    missing = list(loading.get("missing_keys", []))
    head_prefixes = ("cls.", "lm_head", "mlm", "pooler")
    body_missing = [k for k in missing if not k.startswith(head_prefixes)]
    if body_missing:
        raise WorkbenchError(f"{src}: weights missing from the checkpoint: {body_missing[:5]}")
    # a head or pooler the loaded class does not use (an encoder's pooler) is not a mismatch
    extra = [k for k in loading.get("unexpected_keys", []) if not k.endswith(HARMLESS_EXTRA)
             and not any(part.startswith(("cls", "lm_head", "mlm", "pooler"))
                         for part in k.split("."))]
    if extra:  # e.g. num_hidden_layers=2 over the weights of 6 layers: 4 would be dropped
        raise WorkbenchError(f"{src}: the checkpoint holds {len(extra)} weights the config has "
                             f"no place for ({', '.join(sorted(extra)[:3])}, ...); the config "
                             "does not describe these weights (its layer or head counts?)")
    warn_non_finite(hf_model, str(src))
    return hf_model.to(device).eval(), bool(missing)


def warn_non_finite(hf_model: Any, where: str) -> list[str]:
    """Log a warning naming the weights that hold NaN or infinite values (every pattern
    and score of such a model is suspect); return their names."""
    bad = [name for name, tensor in hf_model.state_dict().items()
           if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        log.warning("%s: %d weight tensors hold NaN or infinite values (%s); its patterns "
                    "and scores will not be finite", where, len(bad), ", ".join(bad[:3]))
    return bad


def quiet_transformers() -> None:
    """Silence transformers' own progress bars; the workbench shows its own."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def wrap_hf_model(hf_model: Any, tokenizer: Any, *, name: str, source: str = "in memory",
                  checksum: str = "", dtype: Dtype = "float32", bos_token: str | None = None,
                  has_lm_head: bool = True, bridge_name: str | None = None) -> Model:
    """Wrap an already-loaded Hugging Face model (e.g. a tiny random one in tests)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.utilities.architectures import MASKED_LM_ARCHITECTURES

    if not getattr(hf_model.config, "architectures", None):
        # a model built in memory names no class; the bridge picks its adapter by it
        hf_model.config.architectures = [type(hf_model).__name__]
    for arch in hf_model.config.architectures:
        refuse_unsupported(arch)
    with contextlib.redirect_stdout(None):
        bridge = TransformerBridge.boot_transformers(
            bridge_name or name, hf_model=hf_model, tokenizer=tokenizer, dtype=DTYPES[dtype],
            device=str(next(hf_model.parameters()).device),
        )
    cfg = bridge.cfg
    causal = cfg.architecture not in MASKED_LM_ARCHITECTURES
    layer_types, sliding_window = layer_spans(hf_model.config, cfg.n_layers)
    info = ModelInfo(
        name=name, source=source, checksum=checksum, architecture=str(cfg.architecture),
        n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        n_kv_heads=getattr(cfg, "n_key_value_heads", None) or cfg.n_heads,
        d_model=cfg.d_model, d_head=cfg.d_head, n_ctx=cfg.n_ctx, d_vocab=cfg.d_vocab,
        positions=_positions(str(cfg.architecture), cfg.positional_embedding_type),
        causal=causal, has_lm_head=has_lm_head,
        bos_token_id=bos_id(tokenizer, causal, bos_token),
        dtype=dtype, layer_types=layer_types, sliding_window=sliding_window,
    )
    bridge.eval()
    quiet_norms.quiet(bridge)
    return Model(bridge, tokenizer, info)


def bos_id(tokenizer: Any, causal: bool, bos_token: str | None = None) -> int | None:
    """The id prepended to a causal model's prompts: ``bos_token`` (a bundled model's
    own), else the tokenizer's BOS, else its EOS; ``None`` for an encoder, or a tokenizer
    with neither."""
    bos = bos_token or tokenizer.bos_token or tokenizer.eos_token
    return tokenizer.convert_tokens_to_ids(bos) if causal and bos else None


_LAYER_TYPES: dict[str, LayerType] = {"full_attention": "global",
                                       "sliding_attention": "sliding",
                                       "global": "global", "local": "sliding"}
"""Hugging Face's names of layer types (``config.layer_types``, GPT-Neo's
``attention_layers``) as :data:`~workbench.store.records.LayerType`."""


def layer_spans(config: Any, n_layers: int) -> tuple[tuple[LayerType, ...], int | None]:
    """Which layers of a Hugging Face model attend to a sliding window, and how wide it is.

    Read, in this order, from ``config.layer_types`` (Gemma 2 and 3, Qwen2 and others in
    ``transformers`` 5), a ``sliding_window_pattern`` (every n-th layer global: Gemma 3
    configs written before ``layer_types``), GPT-Neo's ``attention_layers`` and
    ``window_size``, or a ``sliding_window`` on a config with no layer types, which its
    family applies to every layer (Mistral, Mixtral, Phi-3, Starcoder2); otherwise every
    layer is global.

    Args:
        config: the Hugging Face model config.
        n_layers: the model's number of layers.

    Returns:
        ``(each layer's type, the window)``; the window is ``None`` when no layer slides.

    Raises:
        WorkbenchError: a layer type the workbench does not read (chunked or linear
            attention), or layer types that do not match the number of layers.
    """
    window = getattr(config, "sliding_window", None)
    names = getattr(config, "layer_types", None)
    pattern = getattr(config, "sliding_window_pattern", None)
    if names is None and isinstance(pattern, int) and pattern > 0:
        names = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(n_layers)]
    elif names is None and isinstance(getattr(config, "attention_layers", None), list):
        names, window = config.attention_layers, getattr(config, "window_size", None)
    elif names is None:
        names = ["full_attention" if window is None else "sliding_attention"] * n_layers
    unknown = sorted({str(n) for n in names} - set(_LAYER_TYPES))
    if unknown or len(names) != n_layers:
        raise WorkbenchError(f"the config's layer types {', '.join(unknown) or len(names)} "
                             f"are not read by the workbench; expected {n_layers} of "
                             "full_attention and sliding_attention")
    types: tuple[LayerType, ...] = tuple(_LAYER_TYPES[n] for n in names)
    if "sliding" not in types:
        return types, None
    if not isinstance(window, int) or window < 1:
        raise WorkbenchError(f"the config has sliding layers but a sliding window of "
                             f"{window!r}; expected a whole number of tokens")
    return types, window


def refuse_unsupported(architecture: str) -> None:
    """Refuse, in one line, a family whose attention the workbench cannot read (T5, Mamba),
    before the bridge is built (see :mod:`workbench.models.adapters`).

    Raises:
        ModelCapabilityError: the family's adapter says why it is unsupported.
    """
    if architecture in adapters.FAMILIES_BY_ARCHITECTURE:
        adapters.adapter_for(architecture).refusal()


def _positions(architecture: str, bridge_kind: str) -> str:
    """The position scheme: the bridge's ALiBi (a Falcon variant has it), else the
    adapter's, else the bridge's rotary or learned."""
    if bridge_kind == "alibi":
        return "alibi"
    if architecture in adapters.FAMILIES_BY_ARCHITECTURE:
        return adapters.adapter_for(architecture).positions
    return "rotary" if bridge_kind == "rotary" else "learned"
