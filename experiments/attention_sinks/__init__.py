"""Attention sinks: where attention mass lands, and what evicting the sink from the window costs.

Question: a large share of attention in trained transformers lands on the first token or on
delimiters that carry no meaning, because the softmax must spend its mass somewhere. How
much, in which heads, on which inputs, with which residual-stream signature; and does a
causal LM still model text when its sink is evicted from the attention window?

Papers and definitions (``A[t, j]`` is a head's weight from query ``t`` to key ``j``, over
the ``T`` real tokens of a prompt; our positions count from 0, the papers' from 1):

- ``first_token`` (``head_scores``): alpha_1 = (1/T) sum_t A[t, 0], the mean weight on the first
  position over all queries (Gu et al. 2024, "When Attention Sink Emerges in Language
  Models: An Empirical View", section 3.2, their alpha_1^{l,h}).
- Sink rate Sink_1^eps (``sink_rates``): the percentage of (layer, head) pairs with
  alpha_1 > eps, computed per sequence and averaged over sequences, as in Gu et al.'s
  released code (``eval_sink_open_source.py``). Their protocol, the default here: eps = 0.3,
  T = 64, about 100 sequences. ``sink_rate_mean_alpha`` applies the threshold to alpha_1
  averaged over the sequences instead (what the heatmap shows). Gu et al. Table 1 reports it
  for natural text, random tokens and a repeated token side by side.
- Inputs: ``natural`` (consecutive 64-token windows of the Python documentation's prose;
  for encoders, pairs of consecutive sentences framed ``[CLS] a [SEP] b [SEP]`` as in Clark
  et al. 2019, split by the one sentence rule of :mod:`workbench.inputs.sentences`),
  ``random`` (uniform token ids from the middle of the vocabulary,
  :func:`workbench.inputs.prompts.random_token_ids`), ``repeated`` (one such token repeated). Causal
  models see each with their BOS, as they frame text, and again without it (``*_no_bos``:
  the same tokens minus the BOS, so that the first content token moves to position 0).
- Where the mass goes: the weight a key receives, r_j = (1/T) sum_t A[t, j] (alpha_j for
  every key, so r_0 = alpha_1), summed over keys of each token type: ``bos``, ``cls``,
  ``sep`` (special tokens by id), ``first_content`` (the first non-special token),
  ``newline`` (a token containing a line break), ``punctuation`` (a token made only of
  Unicode punctuation), ``other``. The types are exclusive, in that order of precedence, so
  the shares of a head sum to 1 (:mod:`workbench.inputs.token_types`). ``top{1,2,3}_share``
  is the weight received by the key ranked first, second and third by r_j;
  ``top_receivers`` says which token types those keys are.
- Layer types (``layer_type`` in ``head_scores``, ``input_scores``, ``sink_per_prompt``):
  ``sliding`` for a layer whose query sees only its last W keys (gemma3: W = 512, 15 of
  18 layers), ``global`` otherwise. ``sink_rates`` rates the heads of every layer
  (``layers = all``) and, in a model with both kinds, the sliding and the global layers
  apart; ``null_rate`` is the same rate for attention uniform over the keys each query
  sees, its window included, on the same sequences: a uniform head's alpha_1 on ``n``
  tokens is ``(1/n) sum_{t < min(n, W)} 1 / (t + 1)`` (``W = n`` in a global layer; ``1/n``
  in an encoder), so at T = 64 it is H_64 / 64 = 0.07 and the null is 0%.
- The window edge (``window_edge``, ``edge_destinations``; models with a sliding layer):
  where a sliding layer's first-token mass goes once the first token is out of reach, an
  open question after StreamingLLM. On ``edge_prompts`` documents of ``W + n`` tokens (n =
  ``edge_queries``; the same prose, BOS first), with the queries just before the edge
  ``I = {W - n <= t < W}`` (the last that see position 0) and just after it ``O = {W <= t
  < W + n}`` (the first that do not), each head's measures are means over documents of::

      first_in   = mean_{t in I} A[t, 0]          first_out     = mean_{t in O} A[t, 0]
      diagonal_in = mean_{t in I} A[t, t]         diagonal_out  = mean_{t in O} A[t, t]
      edge_out   = mean_{t in O} A[t, t - W + 1]  neighbour_out = mean_{t in O} A[t, t - W + 2]
      beyond_out = mean_{t in O} sum_{k <= t - W} A[t, k]

  (``first_out`` and ``beyond_out`` are exactly 0 in a sliding layer). The lost mass is
  ``lost = first_in - first_out``, and its destinations ``to_edge = (edge_out -
  neighbour_out) / lost`` (the window's first key's gain over an ordinary key at nearly the
  same distance), ``to_diagonal = (diagonal_out - diagonal_in) / lost`` (the query's own
  gain across the edge) and ``spread = 1 - to_edge - to_diagonal``. A sliding head with
  ``first_in > eps`` sends it to the ``edge`` (``to_edge >= 0.5``), the ``diagonal``
  (``to_diagonal >= 0.5``), or ``spread``s it; a sliding head with ``first_in <= eps`` is
  ``no sink``; a global head ``kept`` its first token (the control: the same measures where
  nothing leaves the window). I and O are adjacent, so the main change between them is that
  position 0 left the window; with n << W a uniform head's diagonal moves by little
  (1/480 against 1/512 at the defaults).
- ``entropy``, ``normalized_entropy``: the attention entropy of each head, to separate
  broad from focused heads (Clark et al. 2019, "What Does BERT Look At?", section 3.4).
- Massive activations (Sun et al. 2024, "Massive Activations in Large Language Models",
  section 2): per layer boundary of the residual stream, the three largest |h[t, d]| with
  their position and dimension, against the median |h| of the prompt
  (:mod:`workbench.recording.residuals`). Sun et al. call an activation massive when it
  exceeds 100 and is about 1,000 times the median; here: |h| > 100 and |h| > 1000 x the
  median, both strict (:func:`workbench.recording.residuals.is_massive`).
- The repeated-token property (Gu et al., appendix C, Propositions 1-4): without absolute
  position embeddings, a sequence of one repeated token has every value vector equal, so
  every attention output, and every hidden state, is the same at every position whatever
  the weights. ``repeated_token_check`` reports max_t |h_t - h_0| per boundary on the
  ``repeated_no_bos`` prompts; it should be float round-off (and it catches a hook or mask
  that treats positions differently).
- Streaming (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks",
  Table 1 and Figure 3): perplexity of one long text when each token may attend to the full
  prefix (``dense``), the last W tokens (``window``, ``0+W``), the first k tokens plus the
  last W - k (``k+(W-k)``), and a fresh forward pass over the last W tokens for each
  prediction (``recompute``, the reference). Windows are attention masks over the full
  sequence at absolute positions (:mod:`workbench.scores.streaming`), not Xiao et al.'s rolling
  cache that re-numbers positions inside the cache: with rotary positions the two agree
  exactly for window attention, and for k sinks they differ only in the distance between a
  query and the sinks. Xiao et al. re-number because their streams run to millions of
  tokens, far past the trained context, where absolute distances would be out of
  distribution; our text is shorter than smollm2's 8192-token context, so every distance is
  one the model saw in training (dense attention sees the BOS at every distance up to
  8191), and the mask-based result is exact and checkable against one full forward pass.
  ``recompute`` is evaluated at every ``recompute_stride``-th position beyond the window
  (``ppl_matched`` compares every variant on exactly those positions). The streamed text is
  the first ``stream_tokens`` tokens of the same prose (topics in name order, blank lines
  between them), after the BOS.

Tables: ``head_scores`` (natural input; ``layer, head, metric, score, ci_low, ci_high,
n_prompts`` for ``first_token``, ``share_*``, ``top{r}_share``, ``entropy``,
``normalized_entropy``), ``input_scores`` (the same for every input, with an ``input``
column), ``sink_rates``, ``sink_per_prompt``, ``top_receivers`` (``input, layer, rank,
token_type, fraction, mean_share``), ``massive_activations`` (per input and boundary:
median over sequences of the top-3 magnitudes and of the median, the ratio, the usual
position, dimension and tokens of the largest, and ``sink_head_share`` of the layer reading
that boundary), ``massive_activations_detail`` (per sequence), ``repeated_token_check``,
``streaming_perplexity`` (per variant: ``ppl`` over all targets, ``ppl_beyond_window`` over
the targets at positions >= W, ``ppl_matched`` with a bootstrap interval) and
``streaming_losses`` (the loss of every evaluated target), ``window_edge`` and
``edge_destinations`` (the window edge, above), and ``skipped`` (``part, reason`` for each
part not run). Every column is declared in ``tables.py``.

Classes (``head_classes``, :mod:`workbench.scores.classes`): every head is tested for the
``sink`` class on the natural input, Gu et al.'s own definition made a test: its mean
alpha_1 over sequences above ``eps`` (and above uniform attention), at the false-discovery
rate ``fdr`` over the model's heads (``n_null_draws`` sign flips). No further pass: the
sink rate counts heads above eps per sequence, the class says which heads are above it
and how sure that is.

A model with sliding-window layers (gemma3) skips streaming perplexity: its variants hand
every layer one 4-D mask, which replaces a sliding layer's own window (``skipped`` says so).
Encoders (minilm) get everything except the BOS comparison and streaming perplexity, which
need a BOS token and a trained causal LM head, and the repeated-token check, which needs
a model without learned absolute positions; the ``skipped`` table and the summary say so.

Example:
    workbench run attention-sinks --model smollm2
    workbench run attention-sinks --model minilm --set n_prompts=32
    python -m experiments.attention_sinks --model smollm2 --set streaming=false
    workbench run attention-sinks --model gemma3 --set edge_prompts=8
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.attention_sinks import checks  # noqa: F401 (registers the claim checks)
from experiments.attention_sinks.scans import input_sets, repeated_check, scan_inputs, skips
from experiments.attention_sinks.streaming import measure_streaming
from experiments.attention_sinks.summary import (
    Result,
    massive_by_layer,
    relate_to_sink,
    sink_classes,
    sink_rates,
    summarize_inputs,
    top_receivers,
)
from experiments.attention_sinks.tables import TABLES
from experiments.attention_sinks.window_edge import measure_window_edge
from workbench.core import progress
from workbench.core.values import MAX_PROMPTS, MAX_SEQUENCE, MAX_TEXT_TOKENS
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.inputs.corpus import Split
from workbench.models.base import Model
from workbench.scores import classes
from workbench.store.schema import with_layer_types


@dataclass(frozen=True)
class Config:
    n_prompts: int = param(100, "sequences per input kind (Gu et al.: about 100)",
                           min=2, max=MAX_PROMPTS)
    seq_len: int = param(64, "tokens per sequence, special tokens included (Gu et al.: "
                             "T = 64)", min=4, max=MAX_SEQUENCE)
    eps: float = param(0.3, "sink threshold on alpha_1 (Gu et al.: 0.3)", min=0.0, max=1.0)
    corpus_split: Split = param(
        "all", "part of the Python documentation used as natural text")
    compare_bos: bool = param(True, "causal models: also run every input without its BOS token")
    n_massive_prompts: int = param(20, "sequences per input kind scanned for massive "
                                       "activations", min=1, max=MAX_PROMPTS)
    streaming: bool = param(True, "causal LMs: measure streaming perplexity with and without "
                                  "sinks")
    stream_tokens: int = param(4096, "length of the streamed text in tokens, BOS included",
                               min=4, max=MAX_TEXT_TOKENS)
    window: int = param(256, "W: keys a query may see in the window variants (sinks "
                             "included)", min=2, max=MAX_SEQUENCE)
    n_sinks: int = param(4, "k: initial tokens kept by the main sink + window variant "
                            "(Xiao et al.: 4)", min=1, max=MAX_SEQUENCE)
    sink_sweep: tuple[int, ...] = param((1, 2, 8), "further values of k to measure, e.g. 1,2,8",
                                        min=1, max=MAX_SEQUENCE)
    recompute_stride: int = param(16, "the recompute reference is evaluated at every n-th "
                                      "position past W", min=1, max=MAX_SEQUENCE)
    chunk: int = param(256, "queries per forward pass in streaming (speed only)",
                       min=1, max=MAX_SEQUENCE)
    fdr: float = shared("fdr")
    n_null_draws: int = shared("n_null_draws")
    window_edge: bool = param(True, "sliding-window models: measure where a sliding layer's "
                                    "first-token mass goes past its window")
    edge_prompts: int = param(16, "documents of window + edge_queries tokens for the window "
                                  "edge", min=2, max=MAX_PROMPTS)
    edge_queries: int = param(64, "n: queries just before and just after the window edge",
                              min=1, max=MAX_SEQUENCE)
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")
    max_batch_tokens: int = shared("max_batch_tokens")

    def __post_init__(self) -> None:
        classes.Testing(fdr=self.fdr, n_draws=self.n_null_draws)  # draws that can reach fdr
        sinks = (self.n_sinks, *self.sink_sweep)
        if max(sinks) >= self.window:
            raise ValueError(f"every sink count must be in 1..window-1 ({self.window - 1}); "
                             f"got n_sinks={self.n_sinks}, sink_sweep={self.sink_sweep}")
        if self.stream_tokens <= self.window + 1:
            raise ValueError(f"stream_tokens ({self.stream_tokens}) must exceed window + 1 "
                             f"({self.window + 1}), or no token ever loses its sink")


DEMO = {"n_prompts": 32, "n_massive_prompts": 8, "stream_tokens": 2048, "recompute_stride": 32,
        "n_boot": 200, "edge_prompts": 8}


@experiment("attention-sinks", config=Config, tables=TABLES, demo=DEMO)
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Sink scores, sink rates, massive activations and streaming perplexity (see above).

    Args:
        model: any bundled model (encoders skip what needs a BOS or an LM head).
        cfg: the config.
        ctx: unused (nothing is written besides the tables).

    Returns:
        The :class:`~experiments.attention_sinks.summary.Result`.
    """
    skipped = skips(model, cfg)
    sets = input_sets(model, cfg)
    info = model.info
    # each step's seconds in a demo run on smollm2 (2 shared cores), for the time left; it
    # has no sliding layers, so the window edge took no time there (on gemma3 it does)
    with progress.stages("attention-sinks", 4, weights=(122, 262, 1, 4)) as stage:
        stage("attention on every input kind")
        per_prompt, resid = scan_inputs(model, sets, cfg)
        repeated = repeated_check(resid, sets, model, skipped)
        stage("streaming perplexity")
        streaming, stream_losses = (None, None) if "streaming" in skipped else \
            measure_streaming(model, cfg)
        stage("the window edge")
        edge, destinations = (None, None) if "window_edge" in skipped else \
            measure_window_edge(model, cfg)
        stage("summaries")
        input_scores = with_layer_types(summarize_inputs(per_prompt, cfg), info.layer_types)
    lengths = {name: [len(model.encode(p)[0]) for p in prompts] for name, prompts in sets.items()}
    rates = sink_rates(per_prompt, cfg, lengths=lengths, causal=info.causal,
                       window=info.sliding_window)
    return Result(
        model=info.name, causal=info.causal, cfg=cfg,
        input_scores=input_scores, rates=rates, window_edge=edge,
        edge_destinations=destinations,
        receivers=top_receivers(per_prompt),
        sink_per_prompt=per_prompt[per_prompt.metric == "first_token"].reset_index(drop=True),
        massive=relate_to_sink(massive_by_layer(resid), input_scores, cfg.eps),
        massive_detail=resid, repeated=repeated,
        streaming=streaming, stream_losses=stream_losses, skipped=skipped,
        head_classes=sink_classes(model, sets["natural"], per_prompt, cfg))
