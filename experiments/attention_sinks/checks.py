"""The claim checks of attention-sinks (``data/claims/attention_sinks.json``).

Each numeric check judges an interval against the claim's threshold
(:meth:`Measurement.compare`): the sink rate's bootstrap interval over sequences, a paired
bootstrap interval of a perplexity ratio over the matched positions, a bootstrap interval of
the fraction of sequences whose largest activation is placed at the start or a delimiter.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pandas as pd

from workbench.core.errors import WorkbenchError
from workbench.harness.claims import Measurement, Side, claim_check, judge
from workbench.harness.tables import read as read_table
from workbench.inputs.token_types import is_delimiter
from workbench.recording.residuals import is_massive
from workbench.scores.stats import bootstrap_mean_ci
from workbench.store.runs import Run

LayerGroup = Literal["all", "sliding", "global"]


def _rate_row(run: Run, input_name: str, layers: LayerGroup = "all") -> pd.Series:
    rates = read_table(run, "sink_rates")  # a run written before layer groups: all "all"
    row = rates[(rates.input == input_name) & (rates.layers == layers)]
    if row.empty:
        known = sorted(set(rates.layers[rates.input == input_name]))
        raise WorkbenchError(f"run {run.id} has no sink rate for input '{input_name}' over "
                             f"{layers} layers (it rates: {', '.join(known) or 'none'})")
    return row.iloc[0]


def _rate_text(row: pd.Series) -> str:
    group = "" if row.get("layers", "all") == "all" else f" ({row.layers} layers)"
    return (f"Sink_1^{row.eps:g} on {row.input}{group} = {row.sink_rate:.1f}% "
            f"[{row.ci_low:.1f}, {row.ci_high:.1f}] of {int(row.n_heads)} heads")


def _rate(run: Run, input_name: str, threshold: float, side: Side,
          report: list[str], layers: LayerGroup = "all") -> Measurement:
    row = _rate_row(run, input_name, layers)
    also = "".join(f"; measured alongside: {_rate_text(_rate_row(run, r, layers))}"
                   for r in report)
    need = "at least" if side == "above" else "at most"
    return Measurement.compare(f"{_rate_text(row)} ({need} {threshold:g}% needed){also}",
                               float(row.sink_rate), float(row.ci_low), float(row.ci_high),
                               threshold, side)


@claim_check("sink_rate_at_least")
def sink_rate_at_least(run: Run, *, input: str, threshold: float,
                       report: tuple[str, ...] = (), layers: LayerGroup = "all"
                       ) -> Measurement:
    """The sink rate on ``input`` is at least ``threshold`` percent: its bootstrap interval
    over sequences is judged. ``report`` names inputs whose rates are shown, not judged;
    ``layers`` rates only the sliding or only the global layers."""
    return _rate(run, input, threshold, "above", list(report), layers)


@claim_check("sink_rate_at_most")
def sink_rate_at_most(run: Run, *, input: str, threshold: float,
                      report: tuple[str, ...] = (), layers: LayerGroup = "all"
                      ) -> Measurement:
    """The sink rate on ``input`` is at most ``threshold`` percent (bootstrap interval)."""
    return _rate(run, input, threshold, "below", list(report), layers)


@claim_check("sink_rate_above_null")
def sink_rate_above_null(run: Run, *, input: str, margin: float,
                         layers: LayerGroup = "all") -> Measurement:
    """The sink rate on ``input`` (over ``layers``) exceeds the rate of uniform attention on
    the same sequences (``null_rate``, the window of each layer included) by at least
    ``margin`` percentage points. The null is exact (no sampling), so the interval judged
    is the rate's bootstrap interval over sequences less the null."""
    row = _rate_row(run, input, layers)
    if "null_rate" not in row or not math.isfinite(row.null_rate):
        return Measurement(f"{_rate_text(row)}; the run has no uniform null (an older run)",
                           verdict="undecided")
    null = float(row.null_rate)
    return Measurement.compare(
        f"{_rate_text(row)}; uniform attention on the same sequences: {null:.1f}%; excess "
        f"{row.sink_rate - null:.1f} [{row.ci_low - null:.1f}, {row.ci_high - null:.1f}] "
        f"points (at least {margin:g} needed)", float(row.sink_rate - null),
        float(row.ci_low - null), float(row.ci_high - null), margin, "above")


@claim_check("repeated_states_identical")
def repeated_states_identical(run: Run, *, tolerance: float) -> Measurement:
    """Every position of a repeated-token sequence has the same hidden state, up to
    ``tolerance`` relative to the largest activation."""
    if "repeated_token_check" not in run.table_names():
        raise WorkbenchError(f"run {run.id} has no repeated-token check "
                             f"({_skip_reason(run, 'repeated')})")
    table = read_table(run, "repeated_token_check")
    worst = table.loc[table.relative_deviation.idxmax()]
    dev = float(worst.relative_deviation)
    # a maximum over every position and boundary, not an estimate: no sampling interval
    return Measurement.compare(
        f"max_t |h_t - h_0| = {worst.max_abs_deviation:.3g} at boundary {int(worst.layer)}, "
        f"{dev:.2g} of max |h| (tolerance {tolerance:g}; a maximum over every position "
        f"and boundary, so no interval)", dev, dev, dev, tolerance, "below")


def _skip_reason(run: Run, part: str) -> str:
    """Why ``part`` was skipped, from the run's ``skipped`` table."""
    if "skipped" not in run.table_names():
        return "see its summary"
    skipped = read_table(run, "skipped")
    reasons = skipped[skipped.part == part].reason
    return reasons.iloc[0] if len(reasons) else "see its summary"


def _stream_row(run: Run, spec: str) -> pd.Series:
    """``dense``, ``window``, ``recompute`` or ``sinks:K`` (the K + (W - K) variant)."""
    if "streaming_perplexity" not in run.table_names():
        raise WorkbenchError(f"run {run.id} has no streaming perplexity "
                             f"({_skip_reason(run, 'streaming')})")
    table = read_table(run, "streaming_perplexity")
    variant, _, k = spec.partition(":")
    picked = table[table.variant == ("sinks+window" if variant == "sinks" else variant)]
    if k:
        picked = picked[picked.n_sinks == int(k)]
    if len(picked) != 1:
        raise WorkbenchError(f"run {run.id} has no streaming variant '{spec}'")
    return picked.iloc[0]


def _matched_nll(run: Run, row: pd.Series) -> pd.Series:
    """The per-position loss of one variant on the positions where recompute is evaluated,
    indexed by position."""
    losses = read_table(run, "streaming_losses")
    matched = losses[losses.variant == "recompute"].position
    mine = losses[(losses.label == row.label) & losses.position.isin(matched)]
    return mine.set_index("position").nll.sort_index()


def ratio_interval(num: pd.Series, den: pd.Series, *, n_boot: int = 1000,
                   seed: int = 0) -> tuple[float, float, float]:
    """The perplexity ratio exp(mean(num - den)) of two per-position losses on the same
    positions, with a paired 95% percentile bootstrap interval over positions."""
    diff = (num - den.reindex(num.index)).to_numpy(dtype=float)
    if not len(diff) or not np.isfinite(diff).all():
        return math.nan, math.nan, math.nan
    low, high = bootstrap_mean_ci(diff, n_boot=n_boot, seed=seed)
    return math.exp(diff.mean()), math.exp(float(low)), math.exp(float(high))


@claim_check("streaming_ratio")
def streaming_ratio(run: Run, *, numerator: str, denominator: str,
                    at_least: float | None = None, at_most: float | None = None
                    ) -> Measurement:
    """Perplexity of ``numerator`` over that of ``denominator`` on the positions where the
    recompute reference is evaluated lies within the given bounds: the paired bootstrap
    interval of the ratio (over those positions) is judged against each bound, and the
    verdict is the worse of the two (fail over undecided over pass)."""
    top, bottom = _stream_row(run, numerator), _stream_row(run, denominator)
    ratio, low, high = ratio_interval(_matched_nll(run, top), _matched_nll(run, bottom))
    bounds_sides: tuple[tuple[float | None, Side], ...] = ((at_least, "above"),
                                                           (at_most, "below"))
    sides = [(b, s) for b, s in bounds_sides if b is not None]
    if not sides:
        raise WorkbenchError("streaming_ratio needs at_least, at_most or both")
    verdicts = [judge(low, high, b, s) for b, s in sides]
    verdict = next((v for v in ("fail", "undecided") if v in verdicts), "pass")
    bounds = " and ".join(f"{'>=' if s == 'above' else '<='} {b:g}" for b, s in sides)
    text = (f"ppl {top.label} {top.ppl_matched:.2f} / {bottom.label} {bottom.ppl_matched:.2f}"
            f" = {ratio:.3f} [{low:.3f}, {high:.3f}] (paired bootstrap over positions; "
            f"needed {bounds}; {int(top.n_matched)} positions of {int(top.n_tokens)}-token "
            "text)")
    # one threshold fits the table's column: the bound nearest the interval
    nearest = min(sides, key=lambda bs: min(abs(low - bs[0]), abs(high - bs[0])))[0]
    return Measurement(text, value=ratio, verdict=verdict, ci_low=low, ci_high=high,
                       threshold=nearest)


def _at_start_or_delimiter(detail: pd.DataFrame) -> pd.Series:
    """Per top-1 row: at position 0, or on a newline or punctuation token (Sun et al.)."""
    delimiter = pd.Series([is_delimiter(t) for t in detail.token], index=detail.index)
    return (detail.position == 0) | delimiter


@claim_check("massive_at_start_or_delimiter")
def massive_at_start_or_delimiter(run: Run, *, min_magnitude: float, min_ratio: float,
                                  min_fraction: float) -> Measurement:
    """At some boundary, the largest activation on natural text is massive (exceeds
    ``min_magnitude`` and ``min_ratio`` x the median, medians over sequences; see
    :func:`workbench.recording.residuals.is_massive`), and in ``min_fraction`` of the
    sequences it sits at the first token or on a delimiter (newline or punctuation)."""
    detail = read_table(run, "massive_activations_detail")
    top1 = detail[(detail.input == "natural") & (detail["rank"] == 1)].copy()
    top1["ratio"] = top1.magnitude / top1.median_abs
    top1["placed"] = _at_start_or_delimiter(top1)
    per_layer = top1.groupby("layer").agg(magnitude=("magnitude", "median"),
                                          ratio=("ratio", "median"), placed=("placed", "mean"),
                                          at_start=("position", lambda p: (p == 0).mean()))
    massive = is_massive(per_layer.magnitude, per_layer.ratio, min_magnitude=min_magnitude,
                         min_ratio=min_ratio)
    hits = per_layer[massive & (per_layer.placed >= min_fraction)]
    peak = per_layer.loc[per_layer.ratio.idxmax()]
    where = (f"boundaries {int(hits.index.min())}..{int(hits.index.max())} qualify"
             if len(hits) else "no boundary qualifies")
    text = (f"{where}; peak |h| {peak.magnitude:.3g} = {peak.ratio:.0f}x median at boundary "
            f"{int(per_layer.ratio.idxmax())}, at position 0 in {peak.at_start:.0%} and at the "
            f"first token or a delimiter in {peak.placed:.0%} of sequences")
    if not massive.any():
        return Measurement(text + " (no boundary is massive)", verdict="fail",
                           value=float(peak.ratio))
    # the placed fraction of each massive boundary, with its bootstrap interval over
    # sequences; the best one is judged against min_fraction
    best = max(per_layer.index[massive], key=lambda b: per_layer.placed[b])
    placed = top1[top1.layer == best].placed.to_numpy(dtype=float)
    low, high = bootstrap_mean_ci(placed)
    return Measurement.compare(
        f"{text}; boundary {int(best)}: placed in {placed.mean():.0%} "
        f"[{float(low):.0%}, {float(high):.0%}] of {len(placed)} sequences (at least "
        f"{min_fraction:.0%} needed)", float(placed.mean()), float(low), float(high),
        min_fraction, "above")


@claim_check("layer_share_at_least")
def layer_share_at_least(run: Run, *, token_type: str, threshold: float) -> Measurement:
    """In some layer, heads give ``token_type`` tokens at least ``threshold`` of their
    attention on average (natural input)."""
    scores = read_table(run, "head_scores")
    share = scores[scores.metric == f"share_{token_type}"]
    if share.empty:
        raise WorkbenchError(f"run {run.id} has no '{token_type}' shares")
    by_layer = share.groupby("layer")[["score", "ci_low", "ci_high"]].mean()
    best = int(by_layer.score.idxmax())
    top = by_layer.loc[best]
    # the head-mean of the heads' bootstrap bounds: wider than the bootstrap of the mean
    return Measurement.compare(
        f"largest head-mean {token_type} share {top.score:.3f} [{top.ci_low:.3f}, "
        f"{top.ci_high:.3f}] in layer {best} (interval: mean of the heads' bootstrap "
        f"bounds; by layer: {', '.join(f'{v:.2f}' for v in by_layer.score)}; threshold "
        f"{threshold})", float(top.score), float(top.ci_low), float(top.ci_high), threshold,
        "above")


@claim_check("sliding_zero_beyond_window")
def sliding_zero_beyond_window(run: Run) -> Measurement:
    """Every sliding layer's queries past the window put exactly zero weight on the keys
    further back than it: the largest ``beyond_out`` of a sliding head (``window_edge``; a
    mean over every query of the documents that lies past the window, of non-negative
    weights, so 0 exactly when every such weight is 0) must be 0. The global layers'
    ``beyond_out`` is reported beside it, to show that the measure sees such weight where
    it exists. An exact maximum, not an estimate: no interval."""
    if "window_edge" not in run.table_names():
        raise WorkbenchError(f"run {run.id} has no window_edge table "
                             f"({_skip_reason(run, 'window_edge')})")
    table = read_table(run, "window_edge")
    beyond = table[table.measure == "beyond_out"]
    if beyond.empty:
        raise WorkbenchError(f"run {run.id} measured no beyond_out (an older run)")
    sliding = beyond[beyond.layer_type == "sliding"]
    glob = beyond[beyond.layer_type == "global"]
    worst = float(sliding.score.max())
    text = (f"largest weight beyond the window over {len(sliding)} sliding heads: {worst:.3g} "
            f"(exactly 0 needed; {int(sliding.n_prompts.iloc[0])} documents, every query "
            "past the window)")
    if len(glob):
        text += (f"; global heads, same queries: {glob.score.min():.3g} to "
                 f"{glob.score.max():.3g}")
    return Measurement(text, value=worst, verdict="pass" if worst == 0 else "fail",
                       ci_low=worst, ci_high=worst, threshold=0.0)
