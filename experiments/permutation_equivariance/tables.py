"""The tables of ``permutation-equivariance``: every case, one verdict per condition, each
prompt's errors per condition, layer and shift, and for the dashboard the patterns, tokens
and permutations of a few prompts."""

from __future__ import annotations

from workbench.store.schema import Table, columns, per_prompt, tables

_CONDITION = columns(
    ("model", "str", "model name"),
    ("component", "str", "attention sublayer, whole model or attention heads"),
    ("condition", "str", "what was permuted or removed (see the experiment's docstring)"),
)
_EXPECTATION = columns(
    ("tolerance", "float", "largest relative error that counts as equal (stated in advance)"),
    ("expected", "str", "equivariant, unchanged (within the tolerance), not equivariant or "
                        "changes (beyond it)"),
)

EQUIVARIANCE = Table("equivariance", "one row per case: a condition on one prompt, seed and "
                     "layer (or shift); conditions that do not apply are one n/a row", (
    *_CONDITION,
    *columns(
        ("seed", "int", "permutation seed; -1 when no permutation is drawn (shifts, n/a)"),
        ("prompt", "int", "prompt index, from 0; -1 when the condition does not apply"),
        ("layer", "int", "layer index, from 0; -1 for whole-model cases", (-1, "n_layers")),
        ("shift", "int", "constant c added to every position id; 0 when none"),
        ("prefix", "int", "prefix permutations: i, the first position not moved; else 0"),
        ("n_tokens", "int", "tokens of the prompt; 0 when the condition does not apply"),
        ("max_rel_error", "float", "max |f(P X) - P f(X)| / max |f(X)| over the positions "
                                   "compared (>= prefix); shifts: f at ids + c against f; "
                                   "heads: permuted against original; NaN when n/a"),
    ),
    *_EXPECTATION,
    *columns(
        ("holds", "bool", "the error is within the tolerance; missing when n/a"),
        ("verdict", "str", "pass (the expectation holds), fail, or n/a"),
        ("note", "str", "why a condition does not apply, or how it was adapted"),
        ("detail", "str", "head cases: the query- and kv-head permutations"),
        ("source", "str", "the paper or argument the expectation comes from"),
    ),
))
VERDICTS = Table("verdicts", "one row per component, condition and shift, over every case", (
    *_CONDITION,
    *columns(
        ("shift", "int", "constant c added to every position id; 0 when none"),
        ("n_cases", "int", "cases measured (n/a rows excluded)"),
        ("n_failed", "int", "cases whose expectation did not hold"),
        ("max_rel_error", "float", "largest relative error over the cases; NaN when n/a"),
        ("min_rel_error", "float", "smallest relative error over the cases; NaN when n/a"),
    ),
    *_EXPECTATION,
    *columns(
        ("verdict", "str", "pass only if every case passes; n/a when the condition does not "
                           "apply"),
        ("note", "str", "the cases' notes (the reason, for n/a)"),
        ("source", "str", "the paper or argument the expectation comes from"),
    ),
))
EQUIVARIANCE_BY_PROMPT = per_prompt(
    "equivariance_by_prompt", "each prompt's relative errors per condition, layer and shift, "
    "over its seeds (what verdicts reduces over prompts and layers; measured cases only)",
    (EQUIVARIANCE.column("component"), EQUIVARIANCE.column("condition"),
     EQUIVARIANCE.column("layer"), EQUIVARIANCE.column("shift")),
    columns(
        ("max_rel_error", "float", "largest relative error of the prompt's cases (one per "
                                   "seed; a shift: one case)"),
        ("min_rel_error", "float", "smallest relative error of the prompt's cases"),
        ("n_cases", "int", "the prompt's cases (its seeds; 1 for a shift)"),
    ))
PATTERNS = Table("patterns", "attention patterns of X and P X at a few prompts and layers "
                 "(sublayer conditions with a full permutation); a permuted pattern is stored "
                 "as computed on P X, rows and columns in the permuted order", columns(
    ("prompt", "int", "prompt index, from 0"),
    ("condition", "str", "the attention-sublayer condition"),
    ("layer", "int", "layer index, from 0", (0, "n_layers")),
    ("seed", "int", "permutation seed; -1 for the original input"),
    ("input", "str", "original (X) or permuted (P X)"),
    ("head", "int", "query head index within the layer, from 0", (0, "n_heads")),
    ("query", "int", "query position, from 0", (0, None)),
    ("key", "int", "key position, from 0", (0, None)),
    ("weight", "float", "attention weight, 0 .. 1"),
))
TOKENS = Table("tokens", "the tokens of every prompt, in their original order", columns(
    ("prompt", "int", "prompt index, from 0"),
    ("position", "int", "position, from 0"),
    ("token", "str", "the token, readable (word markers shown as spaces)"),
))
PERMUTATIONS = Table("permutations", "every position permutation used: (P X)[position] = "
                     "X[source]", columns(
    ("prompt", "int", "prompt index, from 0"),
    ("seed", "int", "permutation seed"),
    ("kind", "str", "full (every position moves) or prefix (only positions < prefix move)"),
    ("prefix", "int", "prefix permutations: i, the first position not moved; full: 0"),
    ("position", "int", "position in the permuted input, from 0"),
    ("source", "int", "the original position of the token now at position"),
))

TABLES = tables(EQUIVARIANCE, VERDICTS, EQUIVARIANCE_BY_PROMPT, PATTERNS, TOKENS,
                PERMUTATIONS)
