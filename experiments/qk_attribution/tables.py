"""The tables of the qk-attribution experiment."""

from __future__ import annotations

from workbench.store.schema import HEAD_KEYS, Column, Table, columns, per_prompt, tables

_SIDE = ("side", "str", "key (the key written by each component, the query whole) or query "
         "(the reverse); with grouped-query attention the key is the head's kv group's")
_COMPONENT = ("component", "str", "embed (token + position embeddings), LxHy (a head's "
              "output), LxMLP, Lxattn_bias, ln_bias, q_bias or k_bias")
_PAIR_KEYS = columns(
    ("prompt", "int", "index of the prompt, from 0"),
    ("query_pos", "int", "query position"),
    ("key_pos", "int", "key position (by the position rule: induction target, previous "
     "token or first token)"),
)

ATTRIBUTION = Table("attribution", "each component's part of the heads' pre-softmax scores "
                    "at the chosen (query, key) pairs, mean over prompts", (
    *HEAD_KEYS,
    *columns(
        ("kv_group", "int", "the key-value head the query head reads"),
        _SIDE, _COMPONENT,
        ("component_kind", "str", "embed, head, mlp or bias"),
        ("component_layer", "int", "layer the component comes from; -1 for embed; the "
         "head's own layer for its biases"),
        ("contribution", "float", "mean over prompts of the mean over pairs of the "
         "component's part of the score (the parts sum to the score)"),
        ("ci_low", "float", "95% bootstrap interval of contribution over prompts, low end"),
        ("ci_high", "float", "95% bootstrap interval over prompts, high end"),
        ("share", "float", "mean over prompts and pairs of contribution / sum over "
         "components of |contribution| (signed, in -1..1)"),
        ("share_ci_low", "float", "95% bootstrap interval of share, low end"),
        ("share_ci_high", "float", "95% bootstrap interval of share, high end"),
        ("n_prompts", "int", "prompts with at least one pair"),
    )))
# each prompt's values of attribution's scalars, so that two runs pair prompt by prompt
# (workbench compare); a prompt without a pair has no rows, as it has no part in the means
ATTRIBUTION_BY_PROMPT = per_prompt(
    "attribution_by_prompt", "each component's part of the heads' pre-softmax scores on "
    "each prompt, mean over its pairs (what attribution averages over prompts)",
    (*HEAD_KEYS, *columns(_SIDE, _COMPONENT)),
    columns(("contribution", "float", "mean over the prompt's pairs of the component's part "
                                      "of the score"),
            ("share", "float", "mean over the prompt's pairs of contribution / sum over "
                               "components of |contribution| (signed, in -1..1)")))
PAIR_CONTRIBUTIONS = Table("pair_contributions", "each component's part of each pair's "
                           "score, per prompt (the Why page's bars)", (
    *HEAD_KEYS, *_PAIR_KEYS,
    *columns(_SIDE, _COMPONENT,
             ("contribution", "float", "the component's part of this pair's score")),
))
PAIR_MATRIX = Table("pair_matrix", "query component x key component parts of the score, "
                    "for the top components of each side plus 'other' (sums to the score)", (
    *HEAD_KEYS,
    *columns(
        ("prompt", "int", "index of the prompt; -1 for the mean over prompts"),
        ("query_pos", "int", "query position; -1 for the mean over every pair"),
        ("query_component", "str", "component on the query side, or other"),
        ("key_component", "str", "component on the key side, or other"),
        ("contribution", "float", "<q^(a), k^(b)> / sqrt(d_head), mean over the pairs "
         "meant"),
    )))
SCORES = Table("scores", "every pair's real score, the sums of its parts, and its weight", (
    *HEAD_KEYS, *_PAIR_KEYS,
    *columns(
        ("score", "float", "the model's pre-softmax score (hook_attn_scores)"),
        ("key_sum", "float", "sum of the key-side parts"),
        ("query_sum", "float", "sum of the query-side parts"),
        ("weight", "float", "the attention weight on the key (hook_pattern)"),
    )), min_rows=1)
PATTERNS = Table("patterns", "each attributed query's whole attention row", (
    *HEAD_KEYS,
    *columns(("prompt", "int", "index of the prompt"), ("query_pos", "int", "query position"),
             ("key_pos", "int", "key position, 0..query_pos"),
             ("weight", "float", "attention weight")),
))
TOKENS = Table("tokens", "the prompts' tokens", columns(
    ("prompt", "int", "index of the prompt"),
    ("position", "int", "position, from 0"),
    ("token_id", "int", "token id"),
    ("token", "str", "the token, readable"),
))
GROUPS = Table("groups", "summed shares of groups of components: the previous-token heads "
               "of the K-composition ablation, random same-layer heads, the embedding", (
    Column("layer", "int", "the attributed head's layer; -1 with head -1: the mean over "
                           "the attributed heads", bounds=(-1, "n_layers")),
    Column("head", "int", "the attributed head; -1 with layer -1", bounds=(-1, "n_heads")),
    *columns(
        _SIDE,
        ("group", "str", "previous-token, random, excess (previous-token minus the mean "
         "over random draws) or embed"),
        ("draw", "int", "random draw, from 0; -1 otherwise"),
        ("members", "str", "the group's components, e.g. 'L3H1 L4H0'"),
        ("share", "float", "mean over prompts of the group's summed share; layer = head "
         "= -1 is the mean over the attributed heads"),
        ("ci_low", "float", "95% bootstrap interval over prompts, low end"),
        ("ci_high", "float", "95% bootstrap interval over prompts, high end"),
        ("n_prompts", "int", "prompts"),
    )))
PATH_CHECK = Table("path_check", "cross-check: each top component removed from only this "
                   "head's key (or query) input, the pattern recomputed", (
    *HEAD_KEYS,
    *columns(
        _SIDE, _COMPONENT,
        ("contribution", "float", "the linear attribution, mean over the checked pairs"),
        ("score_drop", "float", "clean score minus patched score, mean over the same pairs"),
        ("max_abs_diff", "float", "largest |score drop - contribution| over the pairs"),
        ("weight_drop", "float", "clean minus patched attention weight on the key, mean"),
        ("rank_linear", "int", "rank of |contribution| among the checked components, 1 = "
         "largest"),
        ("rank_patch", "int", "rank of |score_drop| among them"),
        ("sign_agrees", "bool", "contribution and score_drop have the same sign"),
        ("n_prompts", "int", "prompts patched"),
    )))
SOURCES = Table("sources", "where the explained heads and the previous-token heads came "
                "from", columns(
    ("part", "str", "heads (the explained heads) or previous (the K-composition group)"),
    ("heads", "str", "the heads, e.g. 'L5H1 L6H9'"),
    ("source", "str", "a run id, 'computed' (scored in this run) or 'given' (the config)"),
    ("experiment", "str", "the experiment of the source run; '' otherwise"),
), keys=("part",), min_rows=2)

TABLES = tables(ATTRIBUTION, PAIR_CONTRIBUTIONS, PAIR_MATRIX, SCORES, PATTERNS, TOKENS,
                GROUPS, PATH_CHECK, SOURCES, ATTRIBUTION_BY_PROMPT)
