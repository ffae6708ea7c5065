"""The claim checks of attention-sinks (``data/claims/attention_sinks.json``)."""

from __future__ import annotations

import pandas as pd

from workbench.core.errors import WorkbenchError
from workbench.harness.claims import Measurement, claim_check
from workbench.inputs.token_types import is_delimiter
from workbench.recording.residuals import is_massive
from workbench.store.runs import Run


def _rate_row(run: Run, input_name: str) -> pd.Series:
    rates = run.table("sink_rates")
    row = rates[rates.input == input_name]
    if row.empty:
        raise WorkbenchError(f"run {run.id} has no sink rate for input '{input_name}'")
    return row.iloc[0]


def _rate_text(row: pd.Series) -> str:
    return (f"Sink_1^{row.eps:g} on {row.input} = {row.sink_rate:.1f}% "
            f"[{row.ci_low:.1f}, {row.ci_high:.1f}] of {int(row.n_heads)} heads")


@claim_check("sink_rate_at_least")
def sink_rate_at_least(run: Run, *, input: str, threshold: float) -> Measurement:
    """The sink rate on ``input`` is at least ``threshold`` percent."""
    row = _rate_row(run, input)
    return Measurement(f"{_rate_text(row)} (at least {threshold}% needed)",
                       bool(row.sink_rate >= threshold), float(row.sink_rate))


@claim_check("sink_rate_at_most")
def sink_rate_at_most(run: Run, *, input: str, threshold: float) -> Measurement:
    """The sink rate on ``input`` is at most ``threshold`` percent."""
    row = _rate_row(run, input)
    return Measurement(f"{_rate_text(row)} (at most {threshold}% needed)",
                       bool(row.sink_rate <= threshold), float(row.sink_rate))


@claim_check("repeated_states_identical")
def repeated_states_identical(run: Run, *, tolerance: float) -> Measurement:
    """Every position of a repeated-token sequence has the same hidden state, up to
    ``tolerance`` relative to the largest activation."""
    if "repeated_token_check" not in run.table_names():
        raise WorkbenchError(f"run {run.id} has no repeated-token check "
                             f"({_skip_reason(run, 'repeated')})")
    table = run.table("repeated_token_check")
    worst = table.loc[table.relative_deviation.idxmax()]
    return Measurement(
        f"max_t |h_t - h_0| = {worst.max_abs_deviation:.3g} at boundary {int(worst.layer)}, "
        f"{worst.relative_deviation:.2g} of max |h| (tolerance {tolerance:g})",
        bool(worst.relative_deviation <= tolerance), float(worst.relative_deviation))


def _skip_reason(run: Run, part: str) -> str:
    """Why ``part`` was skipped, from the run's ``skipped`` table."""
    if "skipped" not in run.table_names():
        return "see its summary"
    skipped = run.table("skipped")
    reasons = skipped[skipped.part == part].reason
    return reasons.iloc[0] if len(reasons) else "see its summary"


def _stream_row(run: Run, spec: str) -> pd.Series:
    """``dense``, ``window``, ``recompute`` or ``sinks:K`` (the K + (W - K) variant)."""
    if "streaming_perplexity" not in run.table_names():
        raise WorkbenchError(f"run {run.id} has no streaming perplexity "
                             f"({_skip_reason(run, 'streaming')})")
    table = run.table("streaming_perplexity")
    variant, _, k = spec.partition(":")
    picked = table[table.variant == ("sinks+window" if variant == "sinks" else variant)]
    if k:
        picked = picked[picked.n_sinks == int(k)]
    if len(picked) != 1:
        raise WorkbenchError(f"run {run.id} has no streaming variant '{spec}'")
    return picked.iloc[0]


@claim_check("streaming_ratio")
def streaming_ratio(run: Run, *, numerator: str, denominator: str,
                    at_least: float | None = None, at_most: float | None = None
                    ) -> Measurement:
    """Perplexity of ``numerator`` over that of ``denominator`` (on the positions where the
    recompute reference is evaluated) lies within the given bounds."""
    top, bottom = _stream_row(run, numerator), _stream_row(run, denominator)
    ratio = top.ppl_matched / bottom.ppl_matched
    passed = (at_least is None or ratio >= at_least) and (at_most is None or ratio <= at_most)
    bounds = " and ".join(b for b in (f">= {at_least}" if at_least is not None else "",
                                      f"<= {at_most}" if at_most is not None else "") if b)
    return Measurement(
        f"ppl {top.label} {top.ppl_matched:.2f} / {bottom.label} {bottom.ppl_matched:.2f} = "
        f"{ratio:.3g} (needed {bounds}; {int(top.n_matched)} positions of "
        f"{int(top.n_tokens)}-token text)", bool(passed), float(ratio))


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
    detail = run.table("massive_activations_detail")
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
    return Measurement(
        f"{where}; peak |h| {peak.magnitude:.3g} = {peak.ratio:.0f}x median at boundary "
        f"{int(per_layer.ratio.idxmax())}, at position 0 in {peak.at_start:.0%} and at the "
        f"first token or a delimiter in {peak.placed:.0%} of sequences",
        bool(len(hits)), float(peak.ratio))


@claim_check("layer_share_at_least")
def layer_share_at_least(run: Run, *, token_type: str, threshold: float) -> Measurement:
    """In some layer, heads give ``token_type`` tokens at least ``threshold`` of their
    attention on average (natural input)."""
    scores = run.table("head_scores")
    share = scores[scores.metric == f"share_{token_type}"]
    if share.empty:
        raise WorkbenchError(f"run {run.id} has no '{token_type}' shares")
    by_layer = share.groupby("layer").score.mean()
    best = int(by_layer.idxmax())
    return Measurement(
        f"largest head-mean {token_type} share {by_layer[best]:.3f} in layer {best} "
        f"(by layer: {', '.join(f'{v:.2f}' for v in by_layer)}; threshold {threshold})",
        bool(by_layer[best] >= threshold), float(by_layer[best]))
