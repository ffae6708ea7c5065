"""What the qk-attribution experiment measures: the split of the chosen heads' scores, the
group shares the claims judge, and the path-patch cross-check."""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from experiments.qk_attribution.tables import ATTRIBUTION_BY_PROMPT
from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.core.values import shown
from workbench.harness.experiment import Context
from workbench.harness.tables import read as read_table
from workbench.inputs.prompts import Prompt, load_prompt_set, tokens_digest
from workbench.interventions.ablation import Head, random_same_layer
from workbench.interventions.paths import path_removed
from workbench.models.base import Model
from workbench.models.norms import EMBED
from workbench.recording import hooks
from workbench.scores import metrics
from workbench.scores import qk_attribution as qk
from workbench.scores.heads import score_heads, top_heads
from workbench.scores.stats import bootstrap_mean_ci

if TYPE_CHECKING:
    from experiments.qk_attribution import Config

log = logging.getLogger(__name__)

METRIC_SOURCES = {
    # metric: (experiment whose head_scores hold it, position rule)
    "induction": ("induction-heads", "induction"),
    "previous_token": ("previous-token-heads", "previous"),
    "first_token": ("attention-sinks", "first"),
}


@dataclass
class Attributed:
    """One prompt's attribution of every chosen head."""

    prompt: int
    ids: list[int]
    heads: list[qk.HeadAttribution]
    tokens: str = ""
    """The prompt's token digest (:func:`workbench.inputs.prompts.tokens_digest`)."""


def label(head: Head) -> str:
    """``(5, 1)`` as ``L5H1``."""
    return f"L{head[0]}H{head[1]}"


_HEAD = re.compile(r"L(?P<l1>[0-9]{1,6})H(?P<h1>[0-9]{1,6})|(?P<l2>[0-9]{1,6})\.(?P<h2>[0-9]{1,6})",
                   re.IGNORECASE)
"""A head as ``L5H1`` or ``5.1``: ASCII digits only (``int()`` would also read other
scripts' digits and underscores)."""


def parse_heads(spec: str) -> list[Head]:
    """``"L5H1 L6H9"`` (or ``5.1,6.9``) as ``[(5, 1), (6, 9)]``.

    Raises:
        WorkbenchError: a token that is neither form.
    """
    heads = []
    for token in spec.replace(",", " ").split():
        match = _HEAD.fullmatch(token)
        if match is None:
            raise WorkbenchError(f"heads: cannot read {shown(token)}; expected 'auto' or heads "
                                 "like 'L5H1 L6H9' (or '5.1 6.9')")
        layer, head = (match["l1"], match["h1"]) if match["l1"] else (match["l2"], match["h2"])
        heads.append((int(layer), int(head)))
    if not heads:
        raise WorkbenchError("heads: no head given; use 'auto' or e.g. 'L5H1 L6H9'")
    return heads


def _stored_scores(ctx: Context, model: Model, experiment: str) -> tuple[pd.DataFrame, str]:
    """The head scores of the newest run of ``experiment`` on these weights, if any."""
    if ctx.store is None:
        return pd.DataFrame(), ""
    run = ctx.store.latest_on_weights(experiment, model.info)
    if run is None:
        return pd.DataFrame(), ""
    try:
        return read_table(run, "head_scores"), run.id
    except WorkbenchError as exc:
        log.warning("cannot read the head scores of %s: %s", run.id, exc)
        return pd.DataFrame(), ""


def choose_heads(model: Model, cfg: Config, ctx: Context, prompts: Sequence[Prompt]
                 ) -> tuple[list[Head], str]:
    """The heads to explain and where they come from (a run id, 'computed' or 'given')."""
    if cfg.heads != "auto":
        heads = parse_heads(cfg.heads)
        info = model.info
        bad = [label(h) for h in heads if not (0 <= h[0] < info.n_layers
                                                and 0 <= h[1] < info.n_heads)]
        if bad:
            raise WorkbenchError(f"heads {', '.join(bad)} do not exist: {info.name} has "
                                 f"{info.n_layers} layers of {info.n_heads} heads")
        return heads, "given"
    experiment, _ = METRIC_SOURCES[cfg.metric]
    scores, run_id = _stored_scores(ctx, model, experiment)
    if not scores.empty and (scores.metric == cfg.metric).any():
        return top_heads(scores, cfg.metric, cfg.n_heads), run_id
    scores = score_heads(model, prompts, metrics.reductions(cfg.metric),
                         inputs="the prompt set", n_boot=1, seed=cfg.seed)
    return top_heads(scores, cfg.metric, cfg.n_heads), "computed"


def previous_token_heads(model: Model, cfg: Config, ctx: Context, heads: list[Head]
                         ) -> tuple[list[Head], str]:
    """The previous-token heads of the K-composition ablation: read from the newest
    induction-heads run's ablation table on these weights when it tracked the same heads,
    else the top ``n_previous`` previous_token heads (natural text) below the deepest
    chosen head, as that ablation picks them."""
    if ctx.store is not None:
        run = ctx.store.latest_on_weights("induction-heads", model.info)
        try:
            table = read_table(run, "ablation") if run is not None else None
        except WorkbenchError:
            table = None
        if table is not None:
            row = table[table.condition == "previous-token"]
            if len(row) and set(parse_heads(row.tracked.iloc[0])) == set(heads):
                return parse_heads(row.heads.iloc[0]), run.id
    deepest = max(layer for layer, _ in heads)
    if deepest == 0:
        return [], "none below layer 0"
    natural = load_prompt_set("natural", model)
    scores = score_heads(model, natural, metrics.reductions("previous_token"),
                         inputs="natural text", n_boot=1, seed=cfg.seed)
    scores = scores[scores.layer < deepest]
    return top_heads(scores, "previous_token", cfg.n_previous, exclude=heads), "computed"


def attribute_all(model: Model, prompts: Sequence[Prompt], heads: list[Head], rule: str,
                  top: int) -> list[Attributed]:
    """The attribution of every head on every prompt with at least one pair."""
    weights = qk.Weights.of(model)
    out = []
    for i, prompt in enumerate(progress.track(prompts, desc="qk attribution")):
        ids = list(model.encode(prompt)[0])
        pairs = qk.pair_positions(ids, rule)
        if not pairs:
            log.warning("prompt %d has no %s pair; skipped", i, rule)
            continue
        out.append(Attributed(i, ids, qk.attribute_prompt(model, ids, heads, pairs, top=top,
                                                          weights=weights),
                              tokens_digest(prompt)))
    if not out:
        raise WorkbenchError(f"no prompt has a ({rule}) query/key pair to explain; use a "
                             "prompt set with repeated tokens for induction")
    return out


def sources_table(cfg: Config, heads: list[Head], heads_from: str, previous: list[Head],
                  previous_from: str) -> pd.DataFrame:
    """Where the explained heads and the previous-token group came from (a page links to
    the source run)."""
    def experiment(source: str, name: str) -> str:
        return "" if source in ("computed", "given") or source.startswith("none") else name

    return pd.DataFrame([
        {"part": "heads", "heads": " ".join(map(label, heads)), "source": heads_from,
         "experiment": experiment(heads_from, METRIC_SOURCES[cfg.metric][0])},
        {"part": "previous", "heads": " ".join(map(label, previous)), "source": previous_from,
         "experiment": experiment(previous_from, "induction-heads")}])


# ---- tables --------------------------------------------------------------------------------

_COMPONENT = re.compile(r"^L(?P<layer>\d+)(?P<what>H\d+|MLP|attn_bias)$")


def _kind(name: str) -> tuple[str, int]:
    """A component's kind and the layer it comes from (-1: embed; -2: the head's own
    biases, ln_bias, q_bias and k_bias)."""
    if name == EMBED:
        return "embed", -1
    match = _COMPONENT.match(name)
    if match is None:
        return "bias", -2
    what = match["what"]
    kind = "mlp" if what == "MLP" else "bias" if what == "attn_bias" else "head"
    return kind, int(match["layer"])


def _per_prompt(atts: list[Attributed], index: int, side: str
                ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``[prompt, component]`` means over pairs of the contribution and of the share."""
    names = getattr(atts[0].heads[index], f"{side}_components")
    contrib, share = [], []
    for att in atts:
        values = getattr(att.heads[index], side)  # [C, N]
        total = np.abs(values).sum(0, keepdims=True)
        contrib.append(values.mean(1))
        share.append((values / np.where(total > 0, total, 1.0)).mean(1))
    return names, np.stack(contrib), np.stack(share)


def attribution_table(atts: list[Attributed], cfg: Config) -> pd.DataFrame:
    """The ``attribution`` table: per head, side and component, the mean part of the score
    and the mean share over prompts, each with a bootstrap interval over prompts.

    Args:
        atts: :func:`attribute_all`.
        cfg: the run's config (``n_boot``, ``seed``).

    Returns:
        Long format, the columns of ``tables.ATTRIBUTION``.
    """
    rows = []
    for index, head in enumerate(atts[0].heads):
        for side in ("key", "query"):
            names, contrib, share = _per_prompt(atts, index, side)
            c_low, c_high = bootstrap_mean_ci(contrib, n_boot=cfg.n_boot, seed=cfg.seed)
            s_low, s_high = bootstrap_mean_ci(share, n_boot=cfg.n_boot, seed=cfg.seed)
            for c, name in enumerate(names):
                kind, origin = _kind(name)
                rows.append({"layer": head.layer, "head": head.head, "kv_group": head.kv_group,
                             "side": side, "component": name, "component_kind": kind,
                             "component_layer": head.layer if origin == -2 else origin,
                             "contribution": float(contrib[:, c].mean()),
                             "ci_low": float(c_low[c]), "ci_high": float(c_high[c]),
                             "share": float(share[:, c].mean()), "share_ci_low": float(s_low[c]),
                             "share_ci_high": float(s_high[c]), "n_prompts": len(atts)})
    return pd.DataFrame(rows)


def attribution_by_prompt(atts: list[Attributed]) -> pd.DataFrame:
    """The ``attribution_by_prompt`` table: each prompt's mean part of the score and mean
    share of every component, per head and side (what :func:`attribution_table`
    averages over prompts).

    Args:
        atts: :func:`attribute_all`.

    Returns:
        Long format, the columns of ``tables.ATTRIBUTION_BY_PROMPT``.
    """
    prompts = np.array([att.prompt for att in atts])
    digests = np.array([att.tokens for att in atts])
    frames = []
    for index, head in enumerate(atts[0].heads):
        for side in ("key", "query"):
            names, contrib, share = _per_prompt(atts, index, side)  # [P, C] each
            frames.append(pd.DataFrame({
                "prompt": np.repeat(prompts, len(names)),
                "tokens": np.repeat(digests, len(names)),
                "layer": head.layer, "head": head.head, "side": side,
                "component": np.tile(names, len(atts)),
                "contribution": contrib.ravel().astype(np.float64),
                "share": share.ravel().astype(np.float64)}))
    return pd.concat(frames, ignore_index=True)[ATTRIBUTION_BY_PROMPT.names]


def pair_tables(model: Model, atts: list[Attributed]) -> dict[str, pd.DataFrame]:
    """The per-pair tables: contributions, real scores, patterns, pair matrices, tokens."""
    contrib, scores, rows, matrix, tokens = [], [], [], [], []
    for att in atts:
        strs = model.str_tokens(att.ids)
        tokens += [{"prompt": att.prompt, "position": p, "token_id": int(t), "token": s}
                   for p, (t, s) in enumerate(zip(att.ids, strs, strict=True))]
        for h in att.heads:
            base = {"layer": h.layer, "head": h.head, "prompt": att.prompt}
            for side in ("key", "query"):
                values = getattr(h, side)
                for c, name in enumerate(getattr(h, f"{side}_components")):
                    contrib.append(pd.DataFrame({**base, "query_pos": h.query_pos,
                                                 "key_pos": h.key_pos, "side": side,
                                                 "component": name,
                                                 "contribution": values[c]}))
            scores.append(pd.DataFrame({**base, "query_pos": h.query_pos, "key_pos": h.key_pos,
                                        "score": h.score, "key_sum": h.key.sum(0),
                                        "query_sum": h.query.sum(0), "weight": h.weight}))
            for q, row in h.pattern_rows.items():
                rows.append(pd.DataFrame({**base, "query_pos": q,
                                          "key_pos": np.arange(len(row)), "weight": row}))
            matrix.append(_matrix_rows(h, base))
    return {"pair_contributions": pd.concat(contrib, ignore_index=True),
            "scores": pd.concat(scores, ignore_index=True),
            "patterns": pd.concat(rows, ignore_index=True),
            "pair_matrix": _with_means(pd.concat(matrix, ignore_index=True), atts),
            "tokens": pd.DataFrame(tokens)}


def _matrix_rows(h: qk.HeadAttribution, base: dict) -> pd.DataFrame:
    """One prompt's pair matrix for every query (mean over the query's pairs)."""
    out = []
    for q in sorted(set(h.query_pos.tolist())):
        at = h.query_pos == q
        mean = h.pair[:, :, at].mean(-1)
        for a, row in enumerate(h.pair_rows):
            out += [{**base, "query_pos": q, "query_component": row, "key_component": col,
                     "contribution": float(mean[a, b])} for b, col in enumerate(h.pair_cols)]
    return pd.DataFrame(out)


def _with_means(matrix: pd.DataFrame, atts: list[Attributed]) -> pd.DataFrame:
    """Add each head's matrix over every prompt and pair (prompt = query_pos = -1), for the
    components that are top of a side most often; the rest folds into ``other``."""
    out = [matrix]
    for head in atts[0].heads:
        mine = matrix[(matrix.layer == head.layer) & (matrix["head"] == head.head)]
        rows = _most_often(mine.query_component, len(head.pair_rows) - 1)
        cols = _most_often(mine.key_component, len(head.pair_cols) - 1)
        mean = mine.assign(
            query_component=mine.query_component.where(mine.query_component.isin(rows),
                                                       qk.OTHER),
            key_component=mine.key_component.where(mine.key_component.isin(cols), qk.OTHER))
        # sum over the folded cells within each (prompt, query), then mean over them
        per_query = mean.groupby(["prompt", "query_pos", "query_component", "key_component"],
                                 as_index=False).contribution.sum()
        agg = per_query.groupby(["query_component", "key_component"],
                                as_index=False).contribution.sum()
        agg["contribution"] /= per_query.groupby(["prompt", "query_pos"]).ngroups
        out.append(agg.assign(layer=head.layer, head=head.head, prompt=-1, query_pos=-1))
    return pd.concat(out, ignore_index=True)[list(matrix.columns)]


def _most_often(names: pd.Series, k: int) -> list[str]:
    counts = names[names != qk.OTHER].value_counts()
    return list(counts.index[:k])


# ---- groups: previous-token heads against random same-layer heads --------------------------

def group_table(model: Model, atts: list[Attributed], previous: list[Head], cfg: Config
                ) -> pd.DataFrame:
    """Summed shares of the previous-token heads, of ``n_random`` draws of as many random
    same-layer heads, their difference, and of the embedding, per head and side."""
    heads = [(h.layer, h.head) for h in atts[0].heads]
    draws = _draws(model, previous, heads, cfg)
    rows, per_head = [], {}
    for index, head in enumerate(atts[0].heads):
        for side in ("key", "query"):
            names, _, share = _per_prompt(atts, index, side)
            col = {n: i for i, n in enumerate(names)}

            def summed(members: list[Head], share=share, col=col) -> np.ndarray:
                idx = [col[label(m)] for m in members if label(m) in col]
                return share[:, idx].sum(1)

            groups = {("embed", -1, EMBED): summed([]) + share[:, col[EMBED]]}
            if draws:
                prev = summed(previous)
                rand = np.stack([summed(d) for d in draws], 1)  # [prompt, draw]
                groups[("previous-token", -1, " ".join(map(label, previous)))] = prev
                groups |= {("random", i, " ".join(map(label, d))): rand[:, i]
                           for i, d in enumerate(draws)}
                groups[("excess", -1, "previous-token minus mean random")] = prev - rand.mean(1)
            for key, values in groups.items():
                per_head.setdefault((side, *key), []).append(values)
                rows.append(_group_row(head.layer, head.head, side, key, values, cfg))
    for (side, *key), values in per_head.items():  # the mean over heads, per prompt
        rows.append(_group_row(-1, -1, side, tuple(key), np.mean(values, 0), cfg))
    return pd.DataFrame(rows)


def _draws(model: Model, previous: list[Head], heads: list[Head], cfg: Config
           ) -> list[list[Head]]:
    """``n_random`` random same-layer stand-ins for ``previous`` (none when a layer has no
    head left to draw: the comparison is then left out, with a warning)."""
    rng = random.Random(cfg.seed)
    try:
        return [random_same_layer(previous, [*heads, *previous], model.info.n_heads, rng)
                for _ in range(cfg.n_random)] if previous else []
    except WorkbenchError as exc:
        log.warning("no random same-layer control: %s", exc)
        return []


def _group_row(layer: int, head: int, side: str, key: tuple, values: np.ndarray, cfg: Config
               ) -> dict:
    low, high = bootstrap_mean_ci(values[:, None], n_boot=cfg.n_boot, seed=cfg.seed)
    group, draw, members = key
    return {"layer": layer, "head": head, "side": side, "group": group, "draw": draw,
            "members": members, "share": float(values.mean()), "ci_low": float(low[0]),
            "ci_high": float(high[0]), "n_prompts": len(values)}


# ---- the path-patch cross-check ------------------------------------------------------------

def _patched(model: Model, prompts: list[list[int]], source: str, target: Head, side: str
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The target head's scores and pattern per prompt with ``source`` removed from its
    ``side`` input (one batch, the pass stopped at the target's layer)."""
    layer, head = target
    batch = model.batches([qk.ids_prompt(ids) for ids in prompts],
                          max_tokens=max(map(len, prompts)) * len(prompts))[0]
    names = [hooks.scores(layer), hooks.pattern(layer)]
    with torch.no_grad(), path_removed(model, [source], [target], "k" if side == "key" else "q"):
        kept = hooks.capture(model, batch, names)
    scores, pattern = (kept[name][:, head].double() for name in names)
    return [(scores[i], pattern[i]) for i in range(len(prompts))]


def path_check_table(model: Model, atts: list[Attributed], cfg: Config) -> pd.DataFrame:
    """For each head and side, the ``n_patch`` components with the largest mean |part| are
    removed from only that input, on the first ``patch_prompts`` prompts; the score drop
    must equal the linear part (the norm scale is frozen at the patched layer either way)."""
    sample = atts[: cfg.patch_prompts]
    rows = []
    for index, h in enumerate(progress.track(atts[0].heads, desc="path patch check")):
        for side in ("key", "query"):
            names, contrib, _ = _per_prompt(sample, index, side)
            removable = [c for c, n in enumerate(names) if _kind(n)[0] != "bias"]
            order = sorted(removable, key=lambda c: -abs(contrib[:, c].mean()))[: cfg.n_patch]
            for c in order:
                patched = _patched(model, [a.ids for a in sample], names[c],
                                   (h.layer, h.head), side)
                linear, drop, wdrop = [], [], []
                for att, (score, pattern) in zip(sample, patched, strict=True):
                    mine = att.heads[index]
                    q, k = torch.tensor(mine.query_pos), torch.tensor(mine.key_pos)
                    linear.append(getattr(mine, side)[c])
                    drop.append(mine.score - score[q, k].numpy())
                    wdrop.append(mine.weight - pattern[q, k].numpy())
                lin, dr = np.concatenate(linear), np.concatenate(drop)
                rows.append({"layer": h.layer, "head": h.head, "side": side,
                             "component": names[c], "contribution": float(lin.mean()),
                             "score_drop": float(dr.mean()),
                             "max_abs_diff": float(np.abs(dr - lin).max()),
                             "weight_drop": float(np.concatenate(wdrop).mean()),
                             "n_prompts": len(sample)})
    table = pd.DataFrame(rows)
    table["rank_linear"] = _rank(table, "contribution")
    table["rank_patch"] = _rank(table, "score_drop")
    table["sign_agrees"] = np.sign(table.contribution) == np.sign(table.score_drop)
    return table


def _rank(table: pd.DataFrame, column: str) -> pd.Series:
    """Rank of ``|column|`` within each head and side, 1 = largest."""
    magnitude = table[column].abs()
    return magnitude.groupby([table.layer, table["head"], table.side]).rank(
        ascending=False, method="first").astype(int)
