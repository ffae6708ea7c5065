"""What the ioi experiment measures: the behaviour, each component's direct effect, each
head's attention between the named positions, activation patching over layers x positions
and heads, path patching into the name movers' queries and, upstream, into the
S-inhibition heads' keys and values and the induction heads' keys, and the head classes
those give."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import torch

from experiments.ioi.tables import UPSTREAM_PATHS
from workbench.core import progress
from workbench.inputs.batching import Batch
from workbench.inputs.ioi import IOIPrompt, ioi_prompts
from workbench.inputs.prompts import Prompt
from workbench.interventions import replay
from workbench.interventions.ablation import Head
from workbench.interventions.patching import EVERY, NOTHING, Pair, PatchGrid, patch_grid
from workbench.interventions.paths import (
    InputPath,
    path_patched,
    read_points,
    source_outputs,
)
from workbench.models.base import Model
from workbench.models.blocked import PatternBlock
from workbench.recording import hooks
from workbench.scores.logit_attribution import Contrast, direct_effects, logit_difference
from workbench.scores.stats import bootstrap_mean_ci, bootstrap_ratio_ci

if TYPE_CHECKING:
    from experiments.ioi import Config

ATTENDED = (("END", "IO"), ("END", "S1"), ("END", "S1+1"), ("END", "S2"),
            ("S2", "S1"), ("S2", "S1+1"), ("S1+1", "S1"))
"""The ``(query, key)`` named positions each head's attention is read at: from END (name
movers, S-inhibition), from S2 to S1 (duplicate-token) and to S1+1 (induction), from S1+1
to S1 (previous-token)."""


def label(head: Head) -> str:
    return f"L{head[0]}H{head[1]}"


def _names(text: str) -> list[str] | None:
    return None if text == "auto" else text.replace(",", " ").split()


def make_prompts(model: Model, cfg: Config, n: int, templates: Sequence[int], seed: int
                 ) -> list[IOIPrompt]:
    """IOI prompts with the config's name, place and object lists."""
    return ioi_prompts(model, n, templates=templates, names=_names(cfg.names),
                       places=_names(cfg.places), objects=_names(cfg.objects), seed=seed)


def _batches(model: Model, prompts: list[IOIPrompt], max_tokens: int
             ) -> list[tuple[list[int], Batch, Batch]]:
    """``(indices, clean batch, corrupted batch)``: right-padded, the corrupted batch the
    clean one's twin row for row (a corrupted prompt has its clean prompt's length)."""
    out = []
    for batch in model.batches([Prompt(token_ids=p.ids) for p in prompts], max_tokens=max_tokens):
        twin = batch.input_ids.clone()
        for row, i in enumerate(batch.indices):
            twin[row, : len(prompts[i].corrupted)] = torch.tensor(prompts[i].corrupted)
        out.append((list(batch.indices), batch, Batch(twin, batch.attention_mask, None,
                                                       batch.lengths, batch.indices)))
    return out


@dataclass
class Measured:
    """The behavioural prompts' clean pass: each component's direct effect, the logit
    differences, and each head's attention from END to the named positions."""

    names: list[str]
    kinds: list[str]
    layers: list[int]
    parts: np.ndarray
    """``[prompt, component]``"""
    clean: np.ndarray
    corrupted: np.ndarray
    attention: np.ndarray
    """``[prompt, layer, head, pair]`` for the pairs of :data:`ATTENDED`"""
    error: float
    """the largest relative miss of the parts' sum (the dla_sum invariant)"""


def measure_prompts(model: Model, prompts: list[IOIPrompt], cfg: Config) -> Measured:
    """One clean pass per batch (the direct effects; the attention between the named
    positions, read from the pattern blocks of whichever attention path runs) and one
    corrupted pass."""
    info = model.info
    n = len(prompts)
    attention = np.zeros((n, info.n_layers, info.n_heads, len(ATTENDED)))
    clean, corrupted = np.zeros(n), np.zeros(n)
    found: list = []
    now: dict[str, list] = {}

    def consume(block: PatternBlock) -> None:
        weights = block.weights.double()
        for r, (i, p) in enumerate(zip(now["idx"], now["prompts"], strict=True)):
            for j, (query, key) in enumerate(ATTENDED):
                q, k = p.roles[query] - block.q0, p.roles[key] - block.k0
                if 0 <= q < weights.shape[2] and 0 <= k < weights.shape[3]:
                    attention[i, block.layer, :, j] = weights[r, :, q, k].numpy()

    with torch.inference_mode(), hooks.patterns_fed(model, consume):
        for idx, batch, twin in progress.track(_batches(model, prompts, cfg.max_batch_tokens),
                                               desc="direct effects"):
            mine = [prompts[i] for i in idx]
            now.update(idx=idx, prompts=mine)
            contrast = Contrast(torch.tensor([p.io_id for p in mine]),
                                torch.tensor([p.s_id for p in mine]))
            end = torch.tensor([p.roles["END"] for p in mine])
            effects = direct_effects(model, batch, contrast, end)
            now.update(idx=[], prompts=[])  # the corrupted pass's patterns are not kept
            corrupted[idx] = logit_difference(model, twin, contrast, end).double().numpy()
            clean[idx] = effects.total
            found.append((idx, effects))
    first = found[0][1]
    parts = np.zeros((n, len(first.names)))
    for idx, effects in found:
        parts[idx] = effects.parts
    return Measured(first.names, first.kinds, first.layers, parts, clean, corrupted, attention,
                    max(e.error for _, e in found))


# ---- tables of the behaviour ---------------------------------------------------------------

def prompts_table(prompts: list[IOIPrompt], m: Measured) -> pd.DataFrame:
    return pd.DataFrame({
        "prompt": np.arange(len(prompts)), "template": [p.template for p in prompts],
        "order": [p.order for p in prompts], "group": [p.group for p in prompts],
        "text": [p.text for p in prompts], "io": [p.io for p in prompts],
        "s": [p.s for p in prompts], "logit_diff": m.clean,
        "corrupted_logit_diff": m.corrupted, "prefers_io": m.clean > 0})


def behaviour_table(prompts: list[IOIPrompt], m: Measured, cfg: Config) -> pd.DataFrame:
    rows = []
    for scope in ("all", "ABBA", "BABA"):
        mask = np.array([scope in ("all", p.order) for p in prompts])
        if not mask.any():
            continue
        values = m.clean[mask]
        low, high = bootstrap_mean_ci(values[:, None], n_boot=cfg.n_boot, seed=cfg.seed)
        rows.append({"scope": scope, "logit_diff": float(values.mean()), "ci_low": float(low[0]),
                     "ci_high": float(high[0]),
                     "corrupted_logit_diff": float(m.corrupted[mask].mean()),
                     "prefers_io": float((values > 0).mean()), "above_chance": bool(low[0] > 0),
                     "n_prompts": int(mask.sum())})
    return pd.DataFrame(rows)


def direct_table(m: Measured, cfg: Config) -> pd.DataFrame:
    low, high = bootstrap_mean_ci(m.parts, n_boot=cfg.n_boot, seed=cfg.seed)
    total = float(m.clean.mean())
    rows = []
    for c, (name, kind, layer) in enumerate(zip(m.names, m.kinds, m.layers, strict=True)):
        head = int(name.split("H")[1]) if kind == "head" else -1
        effect = float(m.parts[:, c].mean())
        rows.append({"component": name, "kind": kind, "layer": layer, "head": head,
                     "effect": effect, "ci_low": float(low[c]), "ci_high": float(high[c]),
                     "share": effect / total if total else float("nan"),
                     "n_prompts": len(m.parts)})
    return pd.DataFrame(rows)


def attention_table(m: Measured, cfg: Config) -> pd.DataFrame:
    n, n_layers, n_heads, n_pairs = m.attention.shape
    flat = m.attention.reshape(n, -1)
    low, high = bootstrap_mean_ci(flat, n_boot=cfg.n_boot, seed=cfg.seed)
    layer, head, pair = np.unravel_index(np.arange(flat.shape[1]), (n_layers, n_heads, n_pairs))
    return pd.DataFrame({"layer": layer, "head": head,
                         "query": [ATTENDED[j][0] for j in pair],
                         "role": [ATTENDED[j][1] for j in pair], "weight": flat.mean(0),
                         "ci_low": low, "ci_high": high, "n_prompts": n})


# ---- head classes --------------------------------------------------------------------------

def _weight(attention: pd.DataFrame, role: str, query: str = "END") -> pd.Series:
    """Each head's mean attention from ``query`` to ``role``, by ``(layer, head)``."""
    mine = attention[(attention["query"] == query) & (attention.role == role)]
    return mine.set_index(["layer", "head"]).weight


def mover_rows(direct: pd.DataFrame, attention: pd.DataFrame, behaviour: pd.DataFrame,
               cfg: Config) -> pd.DataFrame:
    """Name movers and negative name movers: a head's direct effect at least ``min_effect``
    of the mean logit difference (its interval excluding 0) and its attention from END to
    IO at least ``min_attention``."""
    row = behaviour[behaviour.scope == "all"].iloc[0]
    least = cfg.min_effect * abs(float(row.logit_diff))
    to_io = _weight(attention, "IO")
    rows = []
    for r in direct[direct.kind == "head"].itertuples():
        att = float(to_io[(r.layer, r.head)])
        if att < cfg.min_attention:
            continue
        for cls, ok, rule in (
                ("name mover", r.effect >= least and r.ci_low > 0, "direct effect >="),
                ("negative name mover", r.effect <= -least and r.ci_high < 0,
                 "direct effect <= -")):
            if ok:
                rows.append({"head_class": cls, "layer": r.layer, "head": r.head,
                             "effect": r.effect, "ci_low": r.ci_low, "ci_high": r.ci_high,
                             "attention": att, "claimed": bool(row.above_chance),
                             "criterion": f"{rule}{cfg.min_effect:g} x mean logit difference "
                                          f"({least:.3f}), interval excluding 0; attention "
                                          f"END->IO >= {cfg.min_attention:g}",
                             "n_prompts": r.n_prompts})
    return pd.DataFrame(rows)


def receivers(direct: pd.DataFrame, classes: pd.DataFrame, cfg: Config) -> tuple[list[Head], str]:
    """The name movers, else the top ``n_receivers`` heads by direct effect."""
    movers = classes[classes.head_class == "name mover"] if len(classes) else classes
    if len(movers):
        return [(int(r.layer), int(r.head)) for r in movers.itertuples()], "name movers"
    heads = direct[direct.kind == "head"].nlargest(cfg.n_receivers, "effect")
    return ([(int(r.layer), int(r.head)) for r in heads.itertuples()],
            f"the top {cfg.n_receivers} heads by direct effect (no name mover)")


def inhibition_rows(paths: pd.DataFrame, behaviour: pd.DataFrame, found_movers: bool,
                    cfg: Config) -> pd.DataFrame:
    """S-inhibition heads: path-patched into the name movers' queries, the logit
    difference falls by at least ``min_effect`` (its whole interval), and the head attends
    from END to S2 with at least ``min_attention``."""
    if paths.empty or not found_movers:
        return pd.DataFrame()
    claimed = bool(behaviour[behaviour.scope == "all"].iloc[0].above_chance)
    mine = paths[(paths.ci_high <= -cfg.min_effect) & (paths.attention_s2 >= cfg.min_attention)]
    return pd.DataFrame([{
        "head_class": "s-inhibition", "layer": r.layer, "head": r.head, "effect": r.effect,
        "ci_low": r.ci_low, "ci_high": r.ci_high, "attention": r.attention_s2,
        "claimed": claimed,
        "criterion": f"path patch into the name movers' queries: interval of the relative "
                     f"change <= -{cfg.min_effect:g}; attention END->S2 >= "
                     f"{cfg.min_attention:g}",
        "n_prompts": r.n_prompts} for r in mine.itertuples()])


# ---- activation patching -------------------------------------------------------------------

def pair_of(prompts: list[IOIPrompt]) -> Pair:
    """The clean and corrupted ids of one group (one length), IO - S at END."""
    return Pair(torch.tensor([p.ids for p in prompts]),
                torch.tensor([p.corrupted for p in prompts]),
                Contrast(torch.tensor([p.io_id for p in prompts]),
                         torch.tensor([p.s_id for p in prompts])),
                torch.tensor([p.roles["END"] for p in prompts]))


def groups_of(prompts: list[IOIPrompt]) -> dict[str, list[IOIPrompt]]:
    out: dict[str, list[IOIPrompt]] = {}
    for p in prompts:
        out.setdefault(p.group, []).append(p)
    return out


def _grid_rows(grid: PatchGrid, cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    low, high = grid.interval(n_boot=cfg.n_boot, seed=cfg.seed)
    return grid.normalised(), low, high


def patch_position_rows(model: Model, group: str, prompts: list[IOIPrompt], grid: PatchGrid,
                        cfg: Config) -> list[dict]:
    value, low, high = _grid_rows(grid, cfg)
    first = prompts[0]
    tokens = model.str_tokens(list(first.ids))
    role_at = {pos: role for role, pos in first.roles.items()}
    rows = []
    for li, layer in enumerate(grid.layers):
        for ci, cell in enumerate(grid.cells):
            rows.append({"site": grid.site, "group": group, "layer": layer, "position": cell,
                         "role": role_at.get(cell, ""), "token": tokens[cell] if cell >= 0 else "",
                         "value": float(value[li, ci]), "ci_low": float(low[li, ci]),
                         "ci_high": float(high[li, ci]), "n_prompts": len(prompts)})
    return rows


def combined(grids: list[PatchGrid]) -> PatchGrid:
    """One grid over every group's prompts (same layers and cells)."""
    first = grids[0]
    return PatchGrid(first.site, first.layers, first.cells,
                     np.concatenate([g.values for g in grids]),
                     np.concatenate([g.clean for g in grids]),
                     np.concatenate([g.corrupted for g in grids]))


def patch_head_rows(grid: PatchGrid, cfg: Config) -> pd.DataFrame:
    value, low, high = _grid_rows(grid, cfg)
    rows = [{"layer": layer, "head": cell, "value": float(value[li, ci]),
             "ci_low": float(low[li, ci]), "ci_high": float(high[li, ci]),
             "n_prompts": len(grid.clean)}
            for li, layer in enumerate(grid.layers) for ci, cell in enumerate(grid.cells)]
    return pd.DataFrame(rows)


def patch_all(model: Model, groups: dict[str, list[IOIPrompt]], cfg: Config
              ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, float]]:
    """Every group patched over layers x positions at each of ``cfg.sites`` (plus the
    every-position and no-position checks on ``resid_pre``) and over layers x heads.

    Returns:
        The ``patch_positions`` and ``patch_heads`` tables and the two invariants.
    """
    rows: list[dict] = []
    head_grids = []
    every = nothing = 0.0
    for group, prompts in groups.items():
        pair = pair_of(prompts)
        width = pair.clean.shape[1]
        for site in dict.fromkeys(("resid_pre", *cfg.sites)):
            cells = [*range(width), EVERY] + ([NOTHING] if site == "resid_pre" else [])
            grid = patch_grid(model, pair, site, cells=cells,
                              max_batch_tokens=cfg.max_batch_tokens,
                              desc=f"patch {site} {group}")
            rows += patch_position_rows(model, group, prompts, grid, cfg)
            if site == "resid_pre":
                norm = grid.normalised()
                every = max(every, float(np.abs(norm[:, grid.cells.index(EVERY)] - 1).max()))
                nothing = max(nothing, float(np.abs(norm[:, grid.cells.index(NOTHING)]).max()))
        head_grids.append(patch_grid(model, pair, "z", max_batch_tokens=cfg.max_batch_tokens,
                                     desc=f"patch heads {group}"))
    return (pd.DataFrame(rows), patch_head_rows(combined(head_grids), cfg),
            {"patch_every": every, "patch_nothing": nothing})


# ---- path patching into the receivers' queries ---------------------------------------------

def path_changes(model: Model, groups: dict[str, list[IOIPrompt]], senders: list[Head],
                 targets: list[Head], paths: Sequence[InputPath], cfg: Config, *,
                 source: Literal["corrupted", "clean"] = "corrupted"
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Each sender's output replaced by its output on the ``source`` prompts (``corrupted``,
    the ABC ones; ``clean``, the prompts themselves: nothing may change) in only the
    ``paths`` inputs of ``targets`` (several paths patched at once), on the clean prompts;
    the blocks below the lowest target are replayed from the clean pass.

    Returns:
        The clean logit differences ``[prompt]`` and the patched ones ``[prompt, sender]``,
        the prompts of every group in turn.
    """
    if source not in ("corrupted", "clean"):
        raise ValueError(f"source must be corrupted or clean, got {source!r}")
    upto = min(la for la, _ in targets)
    names = [label(s) for s in senders]
    kept_names = read_points(model, range(upto))
    clean_parts, patched_parts = [], []
    for prompts in groups.values():
        pair = pair_of(prompts)
        batch = Batch.of(pair.clean)
        with torch.inference_mode():
            other = source_outputs(model, batch if source == "clean" else
                                   Batch.of(pair.corrupted), names)
            with replay.kept(model.bridge, kept_names) as prefix:
                clean = logit_difference(model, batch, pair.contrast, pair.positions)
            patched = torch.zeros(len(senders), len(prompts))
            for s, name in enumerate(progress.track(names, desc=f"path patch into "
                                                    f"{'+'.join(paths)}")):
                with replay.replayed(model.bridge, prefix, upto), \
                        contextlib.ExitStack() as stack:
                    for path in paths:
                        stack.enter_context(path_patched(model, [name], targets, path,
                                                         {name: other[name]}))
                    patched[s] = logit_difference(model, batch, pair.contrast, pair.positions)
        clean_parts.append(clean.double().numpy())
        patched_parts.append(patched.double().numpy().T)  # [prompt, sender]
    return np.concatenate(clean_parts), np.concatenate(patched_parts)


def _relative(clean: np.ndarray, patched: np.ndarray, cfg: Config
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``mean(patched - clean) / mean(clean)`` per sender, with its bootstrap interval."""
    change = patched - clean[:, None]
    low, high = bootstrap_ratio_ci(change, clean, n_boot=cfg.n_boot, seed=cfg.seed)
    return change.mean(0) / clean.mean(), low, high


def path_patch_table(model: Model, groups: dict[str, list[IOIPrompt]], targets: list[Head],
                     attention: pd.DataFrame, cfg: Config) -> pd.DataFrame:
    """Each head below the deepest receiver, its output replaced by its output on the
    corrupted (ABC) prompt in only the receivers' queries, on the clean prompts."""
    senders = [(la, h) for la in range(max(la for la, _ in targets))
               for h in range(model.info.n_heads)]
    clean, patched = path_changes(model, groups, senders, targets, ("q",), cfg)
    effect, low, high = _relative(clean, patched, cfg)
    to_s2 = _weight(attention, "S2")
    text = " ".join(label(t) for t in targets)
    return pd.DataFrame([{"layer": la, "head": h, "receivers": text, "path": "q",
                          "effect": float(effect[i]), "ci_low": float(low[i]),
                          "ci_high": float(high[i]), "attention_s2": float(to_s2[(la, h)]),
                          "n_prompts": len(clean)} for i, (la, h) in enumerate(senders)])


# ---- upstream: into the S-inhibition heads' keys and values, the induction heads' keys --------

UPSTREAM = {"s-inhibition": ("kv", ("duplicate-token", "induction")),
            "induction": ("k", ("previous-token",))}
"""Each upstream receiver class: the inputs its senders are patched into (Wang et al.
2022, section 3.3) and the sender classes that patch classifies."""
CLASS_ATTENTION = {"duplicate-token": ("S2", "S1"), "induction": ("S2", "S1+1"),
                   "previous-token": ("S1+1", "S1")}
"""The ``(query, key)`` attention each upstream class needs at least ``min_attention`` of."""
_COLUMN = {"duplicate-token": "attention_s2_s1", "induction": "attention_s2_s1p1",
           "previous-token": "attention_s1p1_s1"}


def upstream_receivers(rows: pd.DataFrame, classes: pd.DataFrame, receiver_class: str,
                       attention_column: str, cfg: Config) -> tuple[list[Head], str]:
    """The heads of ``receiver_class`` (in ``classes``), else the candidates: among the
    senders of the path patch that found that class (``rows``), the ``n_receivers`` whose
    effect is most negative of those with ``attention_column`` at least ``min_attention``.

    Returns:
        The receivers and their kind: ``receiver_class``, or it with `` candidates``.
    """
    mine = classes[classes.head_class == receiver_class] if len(classes) else classes
    if len(mine):
        return [(int(r.layer), int(r.head)) for r in mine.itertuples()], receiver_class
    near = rows[rows[attention_column] >= cfg.min_attention].nsmallest(cfg.n_receivers, "effect")
    return ([(int(r.layer), int(r.head)) for r in near.itertuples()],
            f"{receiver_class} candidates")


def upstream_senders(model: Model, targets: list[Head], receiver_class: str,
                     weights: dict[str, pd.Series], cfg: Config) -> list[Head]:
    """The heads below the deepest of ``targets`` whose attention meets the criterion of at
    least one sender class of ``receiver_class`` (:data:`UPSTREAM`, :data:`CLASS_ATTENTION`):
    a head below ``min_attention`` on every one of them can be in none of those classes, nor
    a candidate receiver of the next patch, whatever its effect, so it is not patched."""
    classes = UPSTREAM[receiver_class][1]
    return [(la, h) for la in range(max(la for la, _ in targets))
            for h in range(model.info.n_heads)
            if any(float(weights[c].get((la, h), 0.0)) >= cfg.min_attention for c in classes)]


def upstream_rows(model: Model, groups: dict[str, list[IOIPrompt]], targets: list[Head],
                  kind: str, attention: pd.DataFrame, cfg: Config) -> pd.DataFrame:
    """Each head below the deepest of ``targets`` (of receiver ``kind``, e.g. ``s-inhibition
    candidates``) that attends as one of the sender classes of :data:`UPSTREAM` must
    (:func:`upstream_senders`), path-patched from the corrupted run into the targets'
    inputs, with the sender's attention of every upstream class."""
    receiver_class = kind.removesuffix(" candidates")
    path = UPSTREAM[receiver_class][0]
    weights = {c: _weight(attention, key, query) for c, (query, key) in CLASS_ATTENTION.items()}
    senders = upstream_senders(model, targets, receiver_class, weights, cfg)
    if not senders:
        return UPSTREAM_PATHS.empty()
    clean, patched = path_changes(model, groups, senders, targets, tuple(path), cfg)
    effect, low, high = _relative(clean, patched, cfg)
    text = " ".join(label(t) for t in targets)
    return pd.DataFrame([{
        "layer": la, "head": h, "receiver_kind": kind, "receivers": text, "path": path,
        "effect": float(effect[i]), "ci_low": float(low[i]), "ci_high": float(high[i]),
        **{_COLUMN[c]: float(w[(la, h)]) for c, w in weights.items()},
        "n_prompts": len(clean)} for i, (la, h) in enumerate(senders)])


def upstream_class_rows(rows: pd.DataFrame, behaviour: pd.DataFrame, cfg: Config
                        ) -> pd.DataFrame:
    """The sender classes of upstream path patches whose receivers are a class, not its
    candidates: the relative change's whole interval at most ``-min_effect`` and the
    class's attention (:data:`CLASS_ATTENTION`) at least ``min_attention``."""
    claimed = bool(behaviour[behaviour.scope == "all"].iloc[0].above_chance)
    out = []
    for kind, (path, sender_classes) in UPSTREAM.items():
        mine = rows[(rows.receiver_kind == kind) & (rows.ci_high <= -cfg.min_effect)]
        for cls in sender_classes:
            query, key = CLASS_ATTENTION[cls]
            out += [{"head_class": cls, "layer": r.layer, "head": r.head, "effect": r.effect,
                     "ci_low": r.ci_low, "ci_high": r.ci_high,
                     "attention": getattr(r, _COLUMN[cls]), "claimed": claimed,
                     "criterion": f"path patch into the {kind} heads' {'+'.join(path)}: "
                                  f"interval of the relative change <= -{cfg.min_effect:g}; "
                                  f"attention {query}->{key} >= {cfg.min_attention:g}",
                     "n_prompts": r.n_prompts}
                    for r in mine.itertuples() if getattr(r, _COLUMN[cls]) >= cfg.min_attention]
    return pd.DataFrame(out)


def upstream_table(model: Model, groups: dict[str, list[IOIPrompt]], paths: pd.DataFrame,
                   classes: pd.DataFrame, attention: pd.DataFrame, behaviour: pd.DataFrame,
                   cfg: Config) -> tuple[pd.DataFrame, list[str]]:
    """The two upstream path patches in turn: into the S-inhibition heads' (or their
    candidates') keys and values, then into the induction heads' (or their candidates')
    keys. A stage whose receivers are all in layer 0 (or that has none) is not run, nor
    any after it.

    Returns:
        The ``upstream_paths`` rows and one note per stage: its receivers, or why not run.
    """
    frames, notes = [], []
    found, column = paths, "attention_s2"
    for receiver_class in UPSTREAM:
        targets, kind = upstream_receivers(found, classes, receiver_class, column, cfg)
        if not targets or max(la for la, _ in targets) == 0:
            notes.append(f"into {kind}: not run (the receivers "
                         f"{'are all in layer 0' if targets else 'are none'})")
            break
        notes.append(f"into {kind}: {' '.join(map(label, targets))}")
        found = upstream_rows(model, groups, targets, kind, attention, cfg)
        frames.append(found)
        classes = upstream_class_rows(found, behaviour, cfg)
        column = _COLUMN["induction"]
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), notes


def check_rows(m: Measured, invariants: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame([
        {"invariant": "dla_sum", "value": m.error,
         "meaning": "max over prompts of |sum of direct effects - logit difference| / max "
                    "|logit difference|"},
        {"invariant": "patch_every", "value": invariants["patch_every"],
         "meaning": "max over groups and layers of |normalised metric - 1| with every "
                    "position of resid_pre patched"},
        {"invariant": "patch_nothing", "value": invariants["patch_nothing"],
         "meaning": "max over groups and layers of |normalised metric| with nothing patched"},
    ])
