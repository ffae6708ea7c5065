"""String options shared by several layers and the command line, each a ``Literal`` type.

They live here, importable without torch, so that the CLI builds its ``choices=`` from
the types themselves (``typing.get_args``) instead of a second list.
"""

from __future__ import annotations

from typing import Literal

Dtype = Literal["float32", "bfloat16", "float16"]
"""Parameter dtype a model is loaded in."""

StoreDtype = Literal["float16", "float32"]
"""Storage dtype of a recording (float16 falls back to float32 per array on overflow)."""

PatternStorage = Literal["auto", "dense", "topk", "qk", "none"]
"""How a recording stores attention patterns: every weight, the k largest per query row
plus exact first-token, diagonal, previous-token and left-out weights, each layer's
queries, keys and row log-sum-exps (every weight exactly, on demand), or not at all;
``auto`` is dense up to 1,024 tokens and topk above."""

AttentionPath = Literal["auto", "blocked", "dense", "fused"]
"""How a pass hands attention patterns to what reads them: ``blocked`` (the model's
attention computed one block of query rows at a time, :mod:`workbench.models.blocked`; no
``[head, T, T]`` pattern exists), ``dense`` (the bridge's whole pattern at ``hook_pattern``,
cut into blocks), ``fused`` (a scan whose metrics all read the fused kernel's statistics,
:mod:`workbench.models.fused`, takes them from the kernel, no weight ever in memory; any
other reader, or a model the kernel cannot serve, keeps ``auto``'s path), or ``auto``
(fused for such a scan on CUDA, else blocked where the model's family has it, else dense)."""

TakenPath = Literal["fused", "blocked", "eager"]
"""The path a run's attention took, as ``run.json`` records it: the fused kernel, the
blocked torch pass, or the bridge's eager attention (the ``dense`` path)."""

Status = Literal["running", "complete", "failed", "interrupted", "damaged"]
"""How a run ended: ``running`` while it is written, ``interrupted`` when its process died,
``damaged`` when its stored files fail their checks (the run's ``error`` says which)."""

Ablation = Literal["zero", "mean", "resample"]
"""What a removed head is replaced by: nothing (``zero``), its mean output over a
reference prompt set (``mean``), or its output on another prompt of the same forward
batch (``resample``, the donor drawn by the mask's seed)."""

FixedAblation = Literal["zero", "mean"]
"""The ablations whose replacement does not depend on the other prompts of a batch: what
an experiment offers whose passes batch copies of one prompt (head-pruning's importance),
where a donor from the same batch would be the prompt itself."""
