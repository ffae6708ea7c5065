"""Load any supported model as a TransformerLens ``TransformerBridge``.

A model argument may be a bundled model (:data:`workbench.zoo.MODELS`), a Hugging Face hub
id (needs a network the first time), a local Hugging Face folder, a local ``.gguf`` file, or
a checkpoint the workbench trained (``<run-id>:<step>``, or ``<run-id>/L<n>:<step>`` for
the n-layer model of a run that trained several; see :mod:`workbench.checkpoints`). Every
route ends in the same place: a :class:`Model` holding the bridge, the tokenizer and a
:class:`ModelInfo` that says what the model is and what it may honestly be used for.

Examples:
    >>> from workbench.models import load_model
    >>> model = load_model("smollm2")                      # doctest: +SKIP
    >>> model.info.n_heads, model.info.n_kv_heads          # doctest: +SKIP
    (9, 3)
    >>> ids = model.encode(Prompt(text="The capital of France is"))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench import checksums, paths, zoo
from workbench.errors import ModelCapabilityError, WorkbenchError
from workbench.prompts import Prompt

log = logging.getLogger(__name__)

Dtype = Literal["float32", "bfloat16", "float16"]
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_CHECKPOINT = re.compile(r"^(?P<run>[\w.\-]+(?:/L\d+)?):(?P<step>\d+)$")
_HUB_HOST = ("huggingface.co", 443)


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded model is, where it came from, and what it can be used for."""

    name: str
    source: str
    checksum: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    n_ctx: int
    d_vocab: int
    positions: str
    causal: bool
    has_lm_head: bool
    bos_token_id: int | None
    dtype: str
    load_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Model:
    """A bridge, its tokenizer, and the facts about the model.

    Attributes:
        bridge: the ``TransformerBridge``; hook it with ``bridge.hooks(fwd_hooks=...)``.
        tokenizer: the Hugging Face tokenizer, used without automatic BOS insertion.
        info: see :class:`ModelInfo`.
    """

    def __init__(self, bridge: Any, tokenizer: Any, info: ModelInfo) -> None:
        self.bridge = bridge
        self.tokenizer = tokenizer
        self.info = info

    def __repr__(self) -> str:
        i = self.info
        return (f"Model({i.name!r}, {i.architecture}, layers={i.n_layers}, "
                f"heads={i.n_heads}/{i.n_kv_heads}, d_model={i.d_model})")

    def encode(self, prompt: Prompt) -> tuple[list[int], list[int] | None]:
        """Token ids (and segment ids for encoder sentence pairs) of one prompt.

        Causal models get their BOS token prepended to text; encoders get the tokenizer's
        own special tokens (``[CLS] a [SEP] b [SEP]``). Pre-tokenized prompts are used as
        they are.

        Raises:
            WorkbenchError: the prompt is empty or longer than the model's context.
        """
        type_ids: list[int] | None = None
        if prompt.token_ids is not None:
            ids = list(prompt.token_ids)
        elif not (prompt.text or "").strip():
            raise WorkbenchError(f"prompt {prompt.label or ''} is empty".replace("  ", " "))
        elif self.info.causal:
            ids = self.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
            if self.info.bos_token_id is not None:
                ids = [self.info.bos_token_id, *ids]
        else:
            enc = self.tokenizer(prompt.text, prompt.pair, add_special_tokens=True)
            ids = enc["input_ids"]
            type_ids = enc.get("token_type_ids")
        if not ids:
            raise WorkbenchError("prompt has no tokens")
        if len(ids) > self.info.n_ctx:
            raise WorkbenchError(
                f"prompt {prompt.label or ''} has {len(ids)} tokens; "
                f"{self.info.name} has a context of {self.info.n_ctx}".replace("  ", " ")
            )
        return ids, type_ids

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

    def require(self, *, causal: bool | None = None, lm_head: bool | None = None,
                what: str = "this") -> None:
        """Refuse, with a reason, what this model cannot honestly do.

        Raises:
            ModelCapabilityError: e.g. a loss asked of an encoder with no trained LM head.
        """
        name = self.info.name
        if causal is True and not self.info.causal:
            raise ModelCapabilityError(f"{what} needs a causal model; {name} is bidirectional")
        if lm_head is True and not self.info.has_lm_head:
            raise ModelCapabilityError(
                f"{what} needs a trained language-model head; {name} has none "
                "(its head is randomly initialised), so no loss or prediction is reported"
            )

    def logits(self, input_ids: Int[Tensor, "batch pos"],
               attention_mask: Int[Tensor, "batch pos"] | None = None
               ) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits of a causal LM (refused for models without a trained head)."""
        self.require(lm_head=True, what="logits")
        return self.bridge(input_ids, attention_mask=attention_mask)


def _readable(token: str) -> str:
    return token.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\n").replace("ĉ", "\t")


def load_model(name: str, *, dtype: Dtype = "float32", device: str = "cpu") -> Model:
    """Load a model by name (see the module docstring for the accepted forms).

    Args:
        name: bundled name, hub id, local folder, ``.gguf`` file, or ``<run-id>:<step>``.
        dtype: parameter dtype; float32 by default.
        device: torch device, ``"cpu"`` by default.

    Raises:
        UnknownNameError / WorkbenchError: with the known names, or why the model cannot
            be loaded (not fetched, corrupt, no network for a hub id).
    """
    if dtype not in DTYPES:
        raise WorkbenchError(f"unknown dtype '{dtype}'; expected one of {', '.join(DTYPES)}")
    start = time.perf_counter()
    if name in zoo.MODELS:
        model = _load_bundled(name, dtype, device)
    elif (m := _CHECKPOINT.match(name)) and not Path(name).exists():
        from workbench import checkpoints

        model = checkpoints.load(m["run"], int(m["step"]), dtype=dtype, device=device)
    elif Path(name).expanduser().exists():
        model = _load_path(Path(name).expanduser(), dtype, device)
    else:
        model = _load_hub(name, dtype, device)
    info = _replace(model.info, load_seconds=round(time.perf_counter() - start, 3))
    model.info = info
    log.info("loaded %s in %.2fs", name, info.load_seconds)
    return model


def _replace(info: ModelInfo, **changes: Any) -> ModelInfo:
    return ModelInfo(**{**info.to_dict(), **changes})


def _load_bundled(name: str, dtype: Dtype, device: str) -> Model:
    spec = zoo.MODELS.get(name)
    if not zoo.is_cached(name):
        log.info("%s is not in the cache yet; fetching it", name)
        zoo.fetch(name)
    manifest = zoo.verify_cached(name)
    return boot_folder(
        zoo.hf_dir(name), name=name, source=spec.source, checksum=manifest["weights_sha256"],
        dtype=dtype, device=device, bos_token=spec.bos_token, has_lm_head=spec.has_lm_head,
    )


def _load_path(path: Path, dtype: Dtype, device: str) -> Model:
    if path.is_file() and path.suffix == ".gguf":
        digest = checksums.sha256_file(path)
        out = paths.cache_dir() / "models" / f"gguf-{digest[:16]}" / "hf"
        if not (out / "config.json").is_file():
            zoo.convert_gguf(path, out)
        return boot_folder(out, name=str(path), source="local GGUF file", checksum=digest,
                           dtype=dtype, device=device)
    if path.is_dir() and (path / "config.json").is_file():
        return boot_folder(path, name=str(path), source="local folder",
                           checksum=_folder_checksum(path), dtype=dtype, device=device)
    raise WorkbenchError(
        f"{path} is neither a Hugging Face model folder (with config.json) nor a .gguf file"
    )


def _folder_checksum(path: Path) -> str:
    """SHA-256 over the weight files of a folder (names and contents, in name order)."""
    import hashlib

    weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pt"))
    digest = hashlib.sha256()
    for p in weights:
        digest.update(p.name.encode())
        digest.update(bytes.fromhex(checksums.sha256_file(p)))
    return digest.hexdigest()


def _load_hub(name: str, dtype: Dtype, device: str) -> Model:
    from transformers import AutoConfig

    known = ", ".join(zoo.MODELS.names())
    try:  # a model already in the Hugging Face cache loads without a network
        AutoConfig.from_pretrained(name, local_files_only=True)
        cached = True
    except (OSError, ValueError):
        cached = False
    if not cached and not _hub_reachable():
        raise WorkbenchError(
            f"'{name}' is not a bundled model ({known}), a local folder or a .gguf file, and "
            "the Hugging Face hub is unreachable (no network), so it cannot be downloaded"
        )
    try:
        return boot_folder(name, name=name, source="Hugging Face hub", checksum="",
                           dtype=dtype, device=device, local_files_only=cached)
    except OSError as exc:
        raise WorkbenchError(
            f"'{name}' is not a bundled model ({known}) and could not be loaded from the "
            f"Hugging Face hub: {str(exc).splitlines()[0]}"
        ) from None


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(_HUB_HOST, timeout=timeout):
            return True
    except OSError:
        return False


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
    config = AutoConfig.from_pretrained(str(src), **hub)
    tokenizer = AutoTokenizer.from_pretrained(str(src), **hub)
    hf_model, head_missing = _load_hf(src, config, DTYPES[dtype], device, hub)
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
    cls = get_hf_model_class_for_architecture(architecture)
    quiet_transformers()
    # A missing head is initialised from the global RNG; seed it so loads are repeatable.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf_model, loading = cls.from_pretrained(
            str(src), config=config, dtype=dtype, attn_implementation="eager",
            output_loading_info=True, **hub,
        )
    missing = list(loading.get("missing_keys", []))
    head_prefixes = ("cls.", "lm_head", "mlm", "pooler")
    body_missing = [k for k in missing if not k.startswith(head_prefixes)]
    if body_missing:
        raise WorkbenchError(f"{src}: weights missing from the checkpoint: {body_missing[:5]}")
    return hf_model.to(device).eval(), bool(missing)


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

    with contextlib.redirect_stdout(None):
        bridge = TransformerBridge.boot_transformers(
            bridge_name or name, hf_model=hf_model, tokenizer=tokenizer, dtype=DTYPES[dtype],
            device=str(next(hf_model.parameters()).device),
        )
    cfg = bridge.cfg
    causal = cfg.architecture not in MASKED_LM_ARCHITECTURES
    bos = bos_token or tokenizer.bos_token or tokenizer.eos_token
    info = ModelInfo(
        name=name, source=source, checksum=checksum, architecture=str(cfg.architecture),
        n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        n_kv_heads=getattr(cfg, "n_key_value_heads", None) or cfg.n_heads,
        d_model=cfg.d_model, d_head=cfg.d_head, n_ctx=cfg.n_ctx, d_vocab=cfg.d_vocab,
        positions="rotary" if cfg.positional_embedding_type == "rotary" else "learned",
        causal=causal, has_lm_head=has_lm_head,
        bos_token_id=tokenizer.convert_tokens_to_ids(bos) if causal and bos else None,
        dtype=dtype,
    )
    bridge.eval()
    return Model(bridge, tokenizer, info)
