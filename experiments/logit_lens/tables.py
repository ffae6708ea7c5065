"""The tables of the logit-lens experiment."""

from __future__ import annotations

from workbench.store.schema import Table, columns, tables

_LOW = ("ci_low", "float", "95% bootstrap interval over prompts, low end")
_HIGH = ("ci_high", "float", "95% bootstrap interval over prompts, high end")
_N = ("n_prompts", "int", "prompts")

LENS = Table("lens", "each read position's answer token through the logit lens, at every "
             "layer boundary", columns(
    ("prompt", "int", "index of the prompt, from 0"),
    ("position", "int", "the position read (its answer is the token after it)"),
    ("layer", "int", "layer boundary 0 .. n_layers: the residual stream entering block "
     "layer; n_layers is the last block's output (the model's own logits)",
     (0, "n_layers+1")),
    ("answer_id", "int", "the answer token's id"),
    ("answer", "str", "the answer token, readable"),
    ("answer_logit", "float", "its logit through the final norm and the unembedding"),
    ("answer_prob", "float", "its probability (softmax over the vocabulary)"),
    ("answer_rank", "int", "tokens with a larger logit (0: the answer is the top token)"),
    ("top_id", "int", "the top token's id"),
    ("top", "str", "the top token, readable"),
    ("top_prob", "float", "the top token's probability"),
), keys=("prompt", "position", "layer"))
LENS_LAYERS = Table("lens_layers", "the logit lens per layer boundary, mean over prompts "
                    "(each prompt's read positions averaged first)", columns(
    ("layer", "int", "layer boundary 0 .. n_layers", (0, "n_layers+1")),
    ("answer_prob", "float", "mean probability of the answer token"),
    _LOW, _HIGH,
    ("answer_top", "float", "share of read positions whose top token is the answer"),
    ("answer_rank", "float", "median rank of the answer over the read positions"),
    ("scale", "str", "the final norm's scale: frozen (the final stream's, linear) or "
     "recomputed (each boundary's own)"),
    _N,
), min_rows=1)
DIRECT_EFFECTS = Table("direct_effects", "each component's direct effect on the answer's "
                       "logit minus the mean logit, the final norm's scale frozen (they sum "
                       "to it)", columns(
    ("component", "str", "embed, LxHy (a head), LxMLP, Lxattn_bias, Lxattn_norm_bias, "
     "ln_final_bias or unembed_bias"),
    ("kind", "str", "embed, head, mlp or bias"),
    ("layer", "int", "layer the component comes from; -1 for embed, n_layers for the final "
     "norm's and the unembedding's biases", (-1, "n_layers+1")),
    ("head", "int", "query head index for a head; -1 otherwise", (-1, "n_heads")),
    ("effect", "float", "mean over prompts (each prompt's read positions averaged first), "
     "in logits"),
    _LOW, _HIGH,
    ("share", "float", "effect / the mean of the answer's centred logit"),
    _N,
), keys=("component",))
DIRECT_PER_PROMPT = Table("direct_per_prompt", "each component's direct effect on each "
                          "prompt (mean over its read positions)", columns(
    ("prompt", "int", "index of the prompt"),
    ("component", "str", "as in direct_effects"),
    ("effect", "float", "the direct effect, in logits"),
    ("total", "float", "the prompt's centred answer logit (the sum of its effects)"),
), keys=("prompt", "component"))
TOKENS = Table("tokens", "the prompts' tokens", columns(
    ("prompt", "int", "index of the prompt"),
    ("position", "int", "position, from 0"),
    ("token_id", "int", "token id"),
    ("token", "str", "the token, readable"),
))
CHECKS = Table("checks", "the invariants the claims check", columns(
    ("invariant", "str", "dla_sum or lens_output"),
    ("value", "float", "the largest deviation measured (see meaning)"),
    ("meaning", "str", "what value is"),
))

TABLES = tables(LENS, LENS_LAYERS, DIRECT_EFFECTS, DIRECT_PER_PROMPT, TOKENS, CHECKS)
