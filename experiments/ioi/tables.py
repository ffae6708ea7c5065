"""The tables of the ioi experiment."""

from __future__ import annotations

from workbench.store.schema import HEAD_KEYS, Column, Table, columns, tables

_LOW = ("ci_low", "float", "95% bootstrap interval over prompts, low end")
_HIGH = ("ci_high", "float", "95% bootstrap interval over prompts, high end")
_N = ("n_prompts", "int", "prompts")
_GROUP = ("group", "str", "template and order, e.g. 'T0 ABBA' (its prompts share every "
          "position)")

PROMPTS = Table("prompts", "every prompt of the behavioural measurement", columns(
    ("prompt", "int", "index of the prompt, from 0"),
    ("template", "int", "index into workbench.inputs.ioi.TEMPLATES"),
    ("order", "str", "ABBA (IO first) or BABA (S first)"),
    _GROUP,
    ("text", "str", "the prompt, ending just before the answer"),
    ("io", "str", "the indirect object (the answer)"),
    ("s", "str", "the subject (named twice)"),
    ("logit_diff", "float", "logit(IO) - logit(S) at the last position (END)"),
    ("corrupted_logit_diff", "float", "the same on the corrupted (ABC) prompt"),
    ("prefers_io", "bool", "logit_diff > 0"),
), keys=("prompt",))
BEHAVIOUR = Table("behaviour", "the logit difference IO - S at END, mean over prompts", columns(
    ("scope", "str", "all, ABBA or BABA"),
    ("logit_diff", "float", "mean logit(IO) - logit(S) at END"),
    _LOW, _HIGH,
    ("corrupted_logit_diff", "float", "the mean on the corrupted (ABC) prompts"),
    ("prefers_io", "float", "share of prompts with logit_diff > 0"),
    ("above_chance", "bool", "the interval of logit_diff is above 0 (head classes are "
     "claimed only then)"),
    _N,
), keys=("scope",), min_rows=1)
DIRECT_EFFECTS = Table("direct_effects", "each component's direct effect on the logit "
                       "difference at END, the final norm's scale frozen (they sum to it)", (
    *columns(
        ("component", "str", "embed, LxHy (a head), LxMLP, Lxattn_bias, Lxattn_norm_bias, "
         "ln_final_bias or unembed_bias"),
        ("kind", "str", "embed, head, mlp or bias"),
    ),
    *columns(
        ("layer", "int", "layer the component comes from; -1 for embed, n_layers for the "
         "final norm's and the unembedding's biases", (-1, "n_layers+1")),
        ("head", "int", "query head index for a head; -1 otherwise", (-1, "n_heads")),
        ("effect", "float", "mean over prompts of the direct effect, in logits"),
        _LOW, _HIGH,
        ("share", "float", "effect / the mean logit difference"),
        _N,
    )), keys=("component",))
ATTENTION = Table("attention", "each head's attention between the named positions", (
    *HEAD_KEYS,
    Column("query", "str", "the position attending: END (to IO, S1, S1+1, S2), S2 (to S1, "
           "S1+1) or S1+1 (to S1); a run written before this column held END only",
           absent="END"),
    *columns(
        ("role", "str", "the position attended to: IO, S1, S1+1 or S2"),
        ("weight", "float", "mean attention weight from the query's position to the role's"),
        _LOW, _HIGH, _N,
    )), keys=('layer', 'head', 'query', 'role'))
CLASSES = Table("classes", "heads sorted into Wang et al.'s classes by the stated criteria", (
    *columns(("head_class", "str", "name mover, negative name mover, s-inhibition, "
              "duplicate-token, induction or previous-token")),
    *HEAD_KEYS,
    *columns(
        ("effect", "float", "name movers: direct effect (logits); the others: relative "
         "change of the logit difference when the head is path-patched into the name "
         "movers' queries (s-inhibition), the s-inhibition heads' keys and values "
         "(duplicate-token, induction) or the induction heads' keys (previous-token)"),
        _LOW, _HIGH,
        ("attention", "float", "attention from END to IO (name movers) or to S2 "
         "(s-inhibition), from S2 to S1 (duplicate-token) or to S1+1 (induction), from "
         "S1+1 to S1 (previous-token)"),
        ("claimed", "bool", "the model performs the task above chance (behaviour interval "
         "above 0), so the class is claimed"),
        ("criterion", "str", "the rule the head met"),
        _N,
    )), keys=('head_class', 'layer', 'head'))
PATCH_POSITIONS = Table("patch_positions", "activation patching of the clean run into the "
                        "corrupted one, layers x positions, normalised (0 corrupted, 1 clean)", (
    *columns(
        ("site", "str", "resid_pre, attn_out or mlp_out"),
        _GROUP,
        ("layer", "int", "layer index, from 0", (0, "n_layers")),
        ("position", "int", "position patched; -1 every position, -2 none (the checks)"),
        ("role", "str", "IO, S1, S1+1, S2, END, or '' for another position"),
        ("token", "str", "the token there, of the group's first clean prompt ('' for -1, -2)"),
        ("value", "float", "(mean patched - mean corrupted) / (mean clean - mean corrupted) "
         "of the logit difference"),
        _LOW, _HIGH, _N,
    ),))
PATCH_HEADS = Table("patch_heads", "each head's output (every position) patched from the clean "
                    "run into the corrupted one, normalised (0 corrupted, 1 clean)", (
    *columns(
        ("layer", "int", "layer index, from 0", (0, "n_layers")),
        ("head", "int", "query head index; -1 every head of the layer", (-1, "n_heads")),
        ("value", "float", "normalised metric, over every patched prompt"),
        _LOW, _HIGH, _N,
    ),), keys=('layer', 'head'))
PATH_PATCHING = Table("path_patching", "each sender head's output replaced by its corrupted "
                      "(ABC) one in only the receivers' queries", (
    *HEAD_KEYS,
    *columns(
        ("receivers", "str", "the receiver heads (the name movers, else the top heads by "
         "direct effect), e.g. 'L9H9 L10H0'"),
        ("path", "str", "q"),
        ("effect", "float", "mean(patched - clean) / mean(clean) of the logit difference"),
        _LOW, _HIGH,
        ("attention_s2", "float", "the sender's attention from END to S2"),
        _N,
    )))
UPSTREAM_PATHS = Table("upstream_paths", "each sender head's output replaced by its "
                       "corrupted (ABC) one in only the keys and values of the S-inhibition "
                       "heads, or the keys of the induction heads (their candidates where "
                       "no head is in the class)", (
    *HEAD_KEYS,
    *columns(
        ("receiver_kind", "str", "s-inhibition or induction (the class's heads), or "
         "'s-inhibition candidates' / 'induction candidates': no head met the class's "
         "criterion, so the receivers are the n_receivers heads closest to it (attention "
         "at least min_attention, the most negative effect), never claimed as the class"),
        ("receivers", "str", "the receiver heads, e.g. 'L7H3 L8H6'"),
        ("path", "str", "kv (keys and values at once, into s-inhibition) or k (into "
         "induction); with grouped-query attention a key-value group is patched whole"),
        ("effect", "float", "mean(patched - clean) / mean(clean) of the logit difference"),
        _LOW, _HIGH,
        ("attention_s2_s1", "float", "the sender's attention from S2 to S1 "
         "(duplicate-token)"),
        ("attention_s2_s1p1", "float", "the sender's attention from S2 to S1+1 (induction)"),
        ("attention_s1p1_s1", "float", "the sender's attention from S1+1 to S1 "
         "(previous-token)"),
        _N,
    )))
CHECKS = Table("checks", "the invariants the claims check", columns(
    ("invariant", "str", "dla_sum, patch_every or patch_nothing"),
    ("value", "float", "the largest deviation measured (see meaning)"),
    ("meaning", "str", "what value is"),
))

TABLES = tables(PROMPTS, BEHAVIOUR, DIRECT_EFFECTS, ATTENTION, CLASSES, PATCH_POSITIONS,
                PATCH_HEADS, PATH_PATCHING, UPSTREAM_PATHS, CHECKS)
