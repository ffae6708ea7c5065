"""The tables of attention-sinks (definitions in the package docstring)."""

from __future__ import annotations

from workbench.store.schema import (
    HEAD_KEYS,
    LAYER_TYPE,
    SCORE_COLUMNS,
    Column,
    Table,
    columns,
    head_classes,
    tables,
)

INPUT = Column("input", "str", "input set: natural, random or repeated, each optionally "
                               "with the suffix _no_bos (the same tokens minus the BOS)")

HEAD_SCORES = Table(
    "head_scores",
    "per-head metrics on natural text: first_token (alpha_1), share_<token type>, "
    "top<r>_share, entropy, normalized_entropy", (*HEAD_KEYS, LAYER_TYPE, *SCORE_COLUMNS),
    min_rows=1)

INPUT_SCORES = Table(
    "input_scores", "the metrics of head_scores on every input set",
    (INPUT, *HEAD_KEYS, LAYER_TYPE, *SCORE_COLUMNS))

SINK_RATES = Table("sink_rates", "Sink_1^eps per input set and layer group (Gu et al. 2024)", (
    INPUT, Column("layers", "str", "the heads rated: all (every layer), or, in a model with "
                                   "both, only the sliding or only the global layers",
                  absent="all"), *columns(
    ("eps", "float", "the threshold on alpha_1"),
    ("sink_rate", "float", "percent of the group's (layer, head) with alpha_1 > eps, per "
                           "sequence, averaged over sequences (0..100)"),
    ("ci_low", "float", "95% bootstrap interval of sink_rate over sequences, low end"),
    ("ci_high", "float", "95% bootstrap interval of sink_rate over sequences, high end"),
    ("null_rate", "float", "the same rate for attention uniform over the keys each query "
                           "sees (its layer's window included) on the same sequences"),
    ("sink_rate_mean_alpha", "float", "percent of heads whose alpha_1 averaged over "
                                      "sequences exceeds eps (0..100)"),
    ("mean_alpha", "float", "alpha_1 averaged over heads and sequences"),
    ("n_prompts", "int", "sequences"),
    ("n_heads", "int", "(layer, head) pairs"),
)), min_rows=1)

TOP_RECEIVERS = Table(
    "top_receivers", "which token types the most-attended keys are, per input, layer and rank",
    (INPUT, *columns(
        ("layer", "int", "layer index, from 0", (0, "n_layers")),
        ("rank", "int", "1, 2 or 3: the key receiving the most, second and third most weight"),
        ("token_type", "str", "bos, cls, sep, first_content, newline, punctuation or other"),
        ("fraction", "float", "share of (sequence, head) pairs whose key of this rank has "
                              "this type (sums to 1 over types)"),
        ("mean_share", "float", "mean weight r_j received by those keys"),
        ("count", "int", "(sequence, head) pairs whose key of this rank has this type"),
    )))

SINK_PER_PROMPT = Table("sink_per_prompt", "alpha_1 of every head on every sequence", (
    *columns(("prompt", "int", "sequence index within its input set"),
             ("layer", "int", "layer index, from 0", (0, "n_layers")),
             ("head", "int", "query head index within the layer, from 0", (0, "n_heads")),
             ("metric", "str", "always first_token"),
             ("score", "float", "alpha_1: mean weight on position 0 over the real queries")),
    INPUT, LAYER_TYPE), keys=("prompt", "input", "layer", "head"))

MASSIVE_ACTIVATIONS = Table(
    "massive_activations",
    "the largest residual-stream activations per input and layer boundary, medians over "
    "sequences (Sun et al. 2024)", (INPUT, *columns(
        ("layer", "int", "layer boundary: 0 = embeddings, l = input of layer l, n_layers = "
                         "output of the last layer", (0, "n_layers+1")),
        ("top1", "float", "median over sequences of the largest |h|"),
        ("top2", "float", "median over sequences of the second largest |h|"),
        ("top3", "float", "median over sequences of the third largest |h|"),
        ("median_abs", "float", "median over sequences of the median |h| of the sequence"),
        ("top1_tokens", "str", "the tokens holding the largest |h|, with the share of "
                               "sequences of each"),
        ("ratio", "float", "median over sequences of largest |h| / median |h|"),
        ("top1_position", "int", "most common position of the largest |h|"),
        ("top1_position_share", "float", "share of sequences with the largest |h| there"),
        ("top1_dim", "int", "most common dimension of the largest |h|"),
        ("top1_dim_share", "float", "share of sequences with the largest |h| in it"),
        ("n_prompts", "int", "sequences scanned"),
        ("sink_head_share", "float", "share of the heads of layer l (reading boundary l) "
                                     "whose mean alpha_1 exceeds eps; NaN at the last "
                                     "boundary"),
    )))

MASSIVE_ACTIVATIONS_DETAIL = Table(
    "massive_activations_detail", "the three largest |h| of every scanned sequence and "
                                  "boundary", (*columns(
        ("prompt", "int", "sequence index within its input set"),
        ("layer", "int", "layer boundary (see massive_activations)", (0, "n_layers+1")),
        ("rank", "int", "1, 2 or 3, by |h|"),
        ("value", "float", "the activation h[t, d], signed"),
        ("magnitude", "float", "|h[t, d]|"),
        ("position", "int", "t, from 0"),
        ("dim", "int", "d, the residual-stream dimension"),
        ("median_abs", "float", "median |h| of the sequence at this boundary"),
        ("spread", "float", "max over t and d of |h[t, d] - h[0, d]|"),
        ("max_abs", "float", "largest |h| of the sequence at this boundary"),
        ("token", "str", "the token at position t"),
        ("token_type", "str", "its token type"),
    ), INPUT))

REPEATED_TOKEN_CHECK = Table(
    "repeated_token_check", "is every position of a repeated-token sequence the same hidden "
                            "state? (Gu et al. 2024, appendix C)", columns(
        ("layer", "int", "layer boundary (see massive_activations)", (0, "n_layers+1")),
        ("max_abs_deviation", "float", "max over sequences, t and d of |h[t, d] - h[0, d]|"),
        ("max_abs_activation", "float", "max over sequences of the largest |h|"),
        ("n_prompts", "int", "sequences (repeated_no_bos, or repeated for models without "
                             "a BOS)"),
        ("relative_deviation", "float", "max_abs_deviation / max_abs_activation: float "
                                        "round-off when the property holds"),
    ))

STREAMING_PERPLEXITY = Table(
    "streaming_perplexity", "perplexity of one long text under each attention window "
                            "(Xiao et al. 2023)", columns(
        ("variant", "str", "dense, window, sinks+window or recompute"),
        ("label", "str", "dense, 0+W, k+(W-k) or recompute W"),
        ("n_sinks", "int", "k: initial tokens kept visible (0 for dense, window, recompute)"),
        ("window", "int", "W, keys a query may see (sinks included); missing for dense"),
        ("positions", "str", "absolute (masks over the full sequence) or fresh window "
                             "(recompute)"),
        ("ppl", "float", "perplexity over every target (NaN for recompute)"),
        ("ppl_beyond_window", "float", "perplexity over the targets of queries at "
                                       "positions >= W (NaN for recompute)"),
        ("ppl_matched", "float", "perplexity over the positions where recompute is "
                                 "evaluated"),
        ("matched_low", "float", "95% bootstrap interval of ppl_matched, low end"),
        ("matched_high", "float", "95% bootstrap interval of ppl_matched, high end"),
        ("n_matched", "int", "positions in ppl_matched"),
        ("n_targets", "int", "targets evaluated"),
        ("n_tokens", "int", "tokens of the streamed text, BOS included"),
    ), keys=("variant", "label"), min_rows=1)

STREAMING_LOSSES = Table("streaming_losses", "the loss of every evaluated target", columns(
    ("variant", "str", "as in streaming_perplexity"),
    ("label", "str", "as in streaming_perplexity"),
    ("n_sinks", "int", "as in streaming_perplexity"),
    ("position", "int", "query position t; the target is token t + 1"),
    ("nll", "float", "next-token loss in nats"),
))

WINDOW_EDGE = Table(
    "window_edge", "where the first-token mass goes at a sliding window's edge: each "
                   "measure of every head, on documents of window + n tokens", (
        *HEAD_KEYS, LAYER_TYPE, *columns(
            ("measure", "str", "first_in / first_out: weight on position 0, over the n "
                               "queries just before / just after the edge (t < W, t >= W); "
                               "diagonal_in / diagonal_out: weight on the query itself, "
                               "same queries; edge_out: weight on the window's first key "
                               "t - W + 1, queries after the edge; neighbour_out: on its "
                               "neighbour t - W + 2, the same queries; beyond_out: total "
                               "weight on the keys further back than the window (k <= "
                               "t - W), the same queries (exactly 0 in a sliding layer)"),
            ("score", "float", "mean over documents of the mean over those queries"),
            ("ci_low", "float", "95% bootstrap interval over documents, low end"),
            ("ci_high", "float", "95% bootstrap interval over documents, high end"),
            ("n_prompts", "int", "documents"),
        )))

EDGE_DESTINATIONS = Table(
    "edge_destinations", "each head's destination of the first-token mass its sliding "
                         "window loses (global heads as the control: nothing is lost)", (
        *HEAD_KEYS, LAYER_TYPE, *columns(
            ("first_in", "float", "alpha_1 while in reach: mean weight on position 0 over the "
                                  "n queries before the edge"),
            ("lost", "float", "first_in - first_out: the mass to account for (first_out is "
                              "exactly 0 in a sliding layer)"),
            ("to_edge", "float", "(edge_out - neighbour_out) / lost: the share gained by the "
                                 "window's first key beyond its neighbour"),
            ("to_diagonal", "float", "(diagonal_out - diagonal_in) / lost: the share gained "
                                     "by the query itself"),
            ("spread", "float", "1 - to_edge - to_diagonal: the share left to every other key"),
            ("destination", "str", "edge (to_edge >= 0.5), diagonal (to_diagonal >= 0.5) or "
                                   "spread, for a sliding head with first_in > eps; no sink "
                                   "(first_in <= eps); kept (a global head: the first token "
                                   "stays in reach)"),
        )))

SKIPPED = Table("skipped", "parts of the experiment not run on this model or config", columns(
    ("part", "str", "bos (the with/without-BOS comparison), repeated (the repeated-token "
                    "check), streaming (streaming perplexity) or window_edge (the window "
                    "edge of sliding layers)"),
    ("reason", "str", "why, in a sentence"),
))

HEAD_CLASSES = head_classes(
    "every head tested for the sink class on the natural input: mean alpha_1 above eps "
    "(Gu et al. 2024's threshold), at the false-discovery rate fdr")

TABLES = tables(HEAD_SCORES, INPUT_SCORES, SINK_RATES, TOP_RECEIVERS, SINK_PER_PROMPT,
                MASSIVE_ACTIVATIONS, MASSIVE_ACTIVATIONS_DETAIL, REPEATED_TOKEN_CHECK,
                STREAMING_PERPLEXITY, STREAMING_LOSSES, WINDOW_EDGE, EDGE_DESTINATIONS,
                SKIPPED, HEAD_CLASSES)
