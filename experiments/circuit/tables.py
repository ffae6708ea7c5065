"""The tables of the circuit experiment."""

from __future__ import annotations

from workbench.store.schema import Column, Table, columns, per_prompt, tables

_NODE_MEANING = ("embed, a head LxHy, an MLP LxMLP, or logits")
EDGES = Table("edges", "every edge of the graph of heads and MLPs, with its attribution score",
              columns(
    ("sender", "str", "the sender: embed, LxHy (a head's output) or LxMLP"),
    ("receiver", "str", "the receiver input: LxHy.q, LxKVg.k, LxKVg.v (per key-value head), "
                        "LxMLP.in or logits"),
    ("sender_layer", "int", "the sender's layer; -1 for the embedding", (-1, "n_layers")),
    ("receiver_layer", "int", "the receiver's layer; n_layers for the logits",
     (0, "n_layers+1")),
    ("receiver_input", "str", "q, k, v, mlp or logits"),
    ("score", "float", "EAP or EAP-IG score: gradient at the receiver input x (clean - "
                       "corrupted) sender output, summed over positions, mean over prompts"),
    ("rank", "int", "rank by |score|, from 1", (1, None)),
    ("exact", "float", "exact edge patching: clean metric minus the metric with this edge "
                       "alone ablated, mean over prompts; NaN where not patched"),
), keys=("sender", "receiver"), min_rows=1)
NODES = Table("nodes", "every node's summed edge scores", (
    Column("node", "str", _NODE_MEANING),
    Column("kind", "str", "embed, head, mlp or logits"),
    Column("layer", "int", "layer; -1 for the embedding, n_layers for the logits",
           bounds=(-1, "n_layers+1")),
    Column("head", "int", "query head index; -1 for a node that is not a head",
           bounds=(-1, "n_heads")),
    Column("layer_type", "str", "the layer's attention span (sliding or global); '-' for "
                                "the embedding and the logits"),
    Column("score_out", "float", "sum of the scores of the edges it sends"),
    Column("score_in", "float", "sum of the scores of the edges into its inputs (a head: "
                                "its q input and its key-value head's k and v inputs)"),
    Column("abs_out", "float", "sum of |score| of the edges it sends"),
), keys=("node",), min_rows=1)
FAITHFULNESS = Table("faithfulness", "the faithfulness of the top-|score| circuits over "
                     "circuit sizes", columns(
    ("fraction", "float", "circuit size as a fraction of the edges", (0, 1)),
    ("n_edges", "int", "edges in the circuit"),
    ("faithfulness", "float", "(m(C) - m(empty)) / (m(full) - m(empty)), m the metric "
                              "averaged over prompts"),
    ("ci_low", "float", "95% bootstrap interval over prompts, low end"),
    ("ci_high", "float", "95% bootstrap interval over prompts, high end"),
), keys=("fraction",), min_rows=1)
SCORES = Table("scores", "the curve's scores and the checks", columns(
    ("name", "str", "cpr (area under the curve), cmd (area between it and 1), spearman_exact "
                    "(rank correlation of the exactly patched edges' scores with their exact "
                    "effects), metric_clean, metric_empty (the metric with every edge "
                    "ablated), metric_corrupted"),
    ("value", "float", "the value"),
), keys=("name",), min_rows=1)

# per-prompt values of the metrics above, so that two runs can be paired prompt by prompt
# (workbench compare); a prompt is a clean input and its corrupted twin, and its tokens
# digest is taken of both
METRIC_BY_PROMPT = per_prompt(
    "metric_by_prompt", "each prompt's metric (a prompt: a clean input and its corrupted "
    "twin, its tokens digest of both): what scores' metric_clean, metric_empty and "
    "metric_corrupted average", (),
    columns(("clean", "float", "the metric with every edge kept (m(full): the clean run's, "
                               "through the same passes as the circuits')"),
            ("empty", "float", "the metric with every edge ablated (m(empty))"),
            ("corrupted", "float", "the metric of the corrupted input")))
FAITHFULNESS_BY_PROMPT = per_prompt(
    "faithfulness_by_prompt", "each prompt's metric m(C) with the circuit of each size kept "
    "and every other edge ablated: faithfulness is (mean m(C) - mean m(empty)) / (mean "
    "m(full) - mean m(empty)), the means over prompts of this table's metric and "
    "metric_by_prompt's empty and clean",
    columns(("fraction", "float", "circuit size as a fraction of the edges", (0, 1))),
    columns(("n_edges", "int", "edges in the circuit"),
            ("metric", "float", "the metric on this prompt with the circuit alone kept")))

CLASS_OVERLAP = Table("class_overlap", "how the heads of the smallest circuit reaching the "
                      "summary's faithfulness overlap the head classes of the runs named by "
                      "classes_from (only with classes_from)", columns(
    ("run", "str", "the run the class was read from"),
    ("experiment", "str", "that run's experiment"),
    ("head_class", "str", "the class: a head_classes class at its declared false-discovery "
                          "rate, or an ioi class where claimed"),
    ("class_size", "int", "heads in the class", (0, None)),
    ("circuit_heads", "int", "heads in the circuit (with an edge among its edges; a head's "
                             "q input, or its output)", (0, None)),
    ("overlap", "int", "circuit heads in the class", (0, None)),
    ("expected", "float", "the overlap expected of as many heads drawn at random: "
                          "circuit_heads x class_size / the model's heads", (0, None)),
    ("p", "float", "hypergeometric upper tail P(overlap >= observed) for heads drawn at "
                   "random", (0, 1)),
    ("heads", "str", "the circuit heads in the class, e.g. 'L9H9 L10H0'"),
), keys=("run", "head_class"))

TABLES = tables(EDGES, NODES, FAITHFULNESS, SCORES, METRIC_BY_PROMPT, FAITHFULNESS_BY_PROMPT,
                CLASS_OVERLAP)
