"""The tables of the induction-formation experiment."""

from __future__ import annotations

from workbench.store.schema import (
    HEAD_KEYS,
    NULL_COLUMNS,
    SCORE_COLUMNS,
    Table,
    columns,
    head_scores_by_prompt,
    per_prompt,
    tables,
)

MODEL = columns(
    ("model", "str", "the trained model, 'L<n_layers>' (e.g. L2)"),
    ("n_layers", "int", "its number of layers"),
)
CHECKPOINT = (*MODEL, *columns(
    ("step", "int", "training step of the checkpoint (0 is the initialisation)"),
    ("tokens", "int", "training tokens seen: step x batch_size x n_ctx"),
))


def _losses(prefix: str, texts: str) -> tuple:
    return columns(
        (f"{prefix}heldout_loss", "float", f"mean next-token loss (nats) on the {texts}"),
        (f"{prefix}loss_early", "float", "mean loss (nats) on positions icl_early +- icl_band"),
        (f"{prefix}loss_late", "float", "mean loss (nats) on positions icl_late +- icl_band"),
        (f"{prefix}icl_score", "float", "ICL score: loss_late - loss_early (nats; negative "
                                        "means it learns in context)"),
    )


TRAINING_CURVE = Table("training_curve", "what every checkpoint of every model measured", (
    *CHECKPOINT,
    *columns(("train_loss", "float", "mean training loss (nats) of the batches since the "
                                     "previous checkpoint; NaN at step 0")),
    *_losses("", "held-out windows (with repeated passages like the training windows)"),
    *_losses("natural_", "same held-out text without repeated passages"),
    *columns(
        ("first_repeat_loss", "float", "mean loss (nats) on the first copy of the repeated "
                                       "random sequences, without its first token"),
        ("second_repeat_loss", "float", "the same on the second copy"),
        ("max_induction", "float", "largest induction score of any head"),
        ("max_previous_token", "float", "largest previous_token score of any head"),
    ),
))
HEAD_SCORES = Table(
    "head_scores", "previous_token and induction of every head at every checkpoint, on the "
    "repeated random sequences", (*CHECKPOINT, *HEAD_KEYS, *SCORE_COLUMNS, NULL_COLUMNS[0]))
HEAD_SCORES_BY_PROMPT = head_scores_by_prompt(
    "each repeated random sequence's previous_token and induction score of every head at "
    "every checkpoint (what head_scores averages)",
    within=(*MODEL, *columns(("step", "int", "training step of the checkpoint (0 is the "
                                             "initialisation)"))))

COMPOSITION_BY_PROMPT = per_prompt(
    "composition_by_prompt", "each repeated random sequence's induction score of the "
    "strongest induction head with each layer-0 head of a final model zero-ablated (what "
    "composition's induction_after averages)",
    (*MODEL, *columns(("ablated_head", "int", "the ablated head of layer 0"),
                      ("target_layer", "int", "layer of the strongest induction head above "
                                              "layer 0"),
                      ("target_head", "int", "that head"))),
    columns(("induction_after", "float", "its induction score on this sequence with the "
                                         "head ablated")))

CURVE_BY_PROMPT = ("heldout_loss", "loss_early", "loss_late", "icl_score",
                   "natural_heldout_loss", "natural_loss_early", "natural_loss_late",
                   "natural_icl_score", "first_repeat_loss", "second_repeat_loss")
"""The columns of ``training_curve`` that are means over probes, kept per probe in
``training_curve_by_prompt`` (``train_loss`` is over training batches, ``max_*`` a
maximum over heads of ``head_scores``, whose probes ``head_scores_by_prompt`` keeps)."""
TRAINING_CURVE_BY_PROMPT = per_prompt(
    "training_curve_by_prompt", "each probe's value of every training_curve column that "
    "averages probes, at every checkpoint of every model (what training_curve averages): "
    "each held-out window, with or without repeated passages, and each repeated random "
    "sequence is a prompt; each kind numbered from 0",
    (*MODEL, *columns(("step", "int", "training step of the checkpoint (0 is the "
                                      "initialisation)"),
                      ("quantity", "str", "the training_curve column: " + ", ".join(
                          CURVE_BY_PROMPT)))),
    columns(("value", "float", "its value on this probe alone (nats)")))


def _signals(prefix: str, texts: str) -> tuple:
    """The ICL jump and the loss bump on one kind of held-out text."""
    return columns(
        (f"{prefix}icl_jump_start", "int", f"step where the fastest fall of {prefix}icl_score "
                                           f"({texts}) starts"),
        (f"{prefix}icl_jump_end", "int", "step where it ends (the next checkpoint)"),
        (f"{prefix}icl_jump_per_1000_steps", "float", "that fall's rate: ICL score change "
                                                      "per 1000 steps (nats)"),
        (f"{prefix}icl_initial", "float", f"{prefix}icl_score at step 0 (nats)"),
        (f"{prefix}icl_final", "float", f"{prefix}icl_score at the last step (nats)"),
        (f"{prefix}icl_before", "float", f"{prefix}icl_score at the start of the widened "
                                         "window (nats)"),
        (f"{prefix}icl_after", "float", f"{prefix}icl_score at its end (nats)"),
        (f"{prefix}icl_jump_in_window", "bool", "the ICL jump lies in the window widened by "
                                                "window_slack checkpoints"),
        (f"{prefix}loss_bump_tested", "bool", f"the loss-bump test could run on "
                                              f"{prefix}heldout_loss: at least 6 checkpoints "
                                              "(after step 0) either side of the widened "
                                              "window"),
        (f"{prefix}loss_bump", "bool", f"{prefix}heldout_loss departs inside the widened "
                                       "window from a quadratic fit in log tokens of up to 8 "
                                       "checkpoints either side, by more than "
                                       "loss_bump_threshold noise SDs (a pause or dip held "
                                       "for 2 checkpoints, or a level shift across it; "
                                       "workbench.scores.phase_change.loss_bump); missing "
                                       "when not tested"),
        (f"{prefix}loss_bump_threshold", "float", "noise SDs a departure must exceed (chosen "
                                                  "for <= 3% false positives on smooth "
                                                  "noisy curves)"),
        (f"{prefix}loss_bump_z", "float", "the test statistic: the larger of the pause/dip "
                                          "and the level shift, in noise SDs"),
        (f"{prefix}loss_bump_step", "float", "the checkpoint in the window furthest from the "
                                             "smooth fit"),
        (f"{prefix}loss_bump_excess", "float", "the loss there minus the fit (nats; positive "
                                               "is above the smooth curve)"),
        (f"{prefix}loss_bump_shift", "float", "the loss after the window minus the smooth "
                                              "trend before it (nats; negative: it fell "
                                              "faster)"),
        (f"{prefix}loss_bump_noise", "float", "robust residual SD of the fit outside the "
                                              "window (nats)"),
        (f"{prefix}coincide", "bool", "the ICL jump and a loss bump both lie in the widened "
                                      "window; missing when the bump was not tested"),
    )


PHASE_CHANGE = Table("phase_change", "each model's phase change, found from its curve, and "
                     "the ICL jump and loss bump on both kinds of held-out text (columns "
                     "without prefix: the repeated-passage windows; natural_: plain text); "
                     "the window's columns are missing values when none was found", (
    *MODEL,
    *columns(
        ("detected", "bool", "the max induction score (running median of 3) rose by at "
                             "least min_rise"),
        ("induction_initial", "float", "max induction score at step 0"),
        ("induction_final", "float", "max induction score at the last step"),
        ("first_repeat_final", "float", "first_repeat_loss at the last step (nats)"),
        ("second_repeat_final", "float", "second_repeat_loss at the last step (nats)"),
        ("start_step", "float", "the window's first step: the last checkpoint at or below "
                                "20% of the rise (of the running median of 3)"),
        ("end_step", "float", "the window's last step: the first at or above 80%"),
        ("mid_step", "float", "the step that ends the steepest interval of the rise"),
        ("start_tokens", "float", "tokens seen at start_step"),
        ("end_tokens", "float", "tokens seen at end_step"),
        ("mid_tokens", "float", "tokens seen at mid_step"),
        ("induction_before", "float", "max induction score before the rise (its base, "
                                      "running median of 3)"),
        ("induction_after", "float", "max induction score after the rise (its peak, "
                                     "running median of 3)"),
    ),
    *_signals("", "repeated-passage held-out windows"),
    *_signals("natural_", "plain held-out text"),
))
COMPOSITION = Table("composition", "K-composition: each layer-0 head of a final model "
                    "zero-ablated in turn, and the strongest induction head measured again", (
    *columns(
        ("ablated_layer", "int", "layer of the ablated head (0)"),
        ("ablated_head", "int", "the ablated head"),
        ("ablated_previous_token", "float", "its previous_token score before ablation"),
        ("target_layer", "int", "layer of the strongest induction head above layer 0"),
        ("target_head", "int", "that head"),
        ("induction_before", "float", "its induction score with nothing ablated"),
        ("induction_after", "float", "its induction score with the head ablated"),
    ),
    *MODEL,
))
CHECKPOINTS = Table("checkpoints", "the checkpoints saved in the run folder (none when run "
                    "outside a run store)", (
    *MODEL,
    *columns(
        ("step", "int", "training step"),
        ("name", "str", "its MODEL name, '<run-id>/L<n>:<step>'"),
        ("path", "str", "its folder, relative to the run folder"),
    ),
))
CHECKPOINT_PATTERNS = Table("checkpoint_patterns", "every head's attention on one repeated "
                            "random sequence at every checkpoint (lower triangle)", (
    *CHECKPOINT,
    *HEAD_KEYS,
    *columns(
        ("query", "int", "query position (0 is BOS)"),
        ("key", "int", "key position, at most the query's"),
        ("weight", "float", "attention weight, 0..1; each query's row sums to 1"),
    ),
))
PATTERN_TOKENS = Table("pattern_tokens", "the tokens of the sequence in checkpoint_patterns",
                       columns(
    ("position", "int", "position, from 0 (BOS)"),
    ("token_id", "int", "token id"),
    ("token", "str", "the token as text"),
))
CORPUS = Table("corpus", "the training text", columns(
    ("sources", "str", "built-in sources and text files, comma-separated"),
    ("sha256", "str", "fingerprint of the whole corpus"),
    ("fit_documents", "int", "documents trained on"),
    ("heldout_documents", "int", "documents held out"),
    ("fit_chars", "int", "characters trained on"),
    ("heldout_chars", "int", "characters held out"),
    ("fit_tokens", "int", "tokens of the training text, document separators included"),
    ("vocab", "int", "tokenizer vocabulary, special tokens included"),
))

TABLES = tables(TRAINING_CURVE, HEAD_SCORES, PHASE_CHANGE, COMPOSITION, CHECKPOINTS,
                CHECKPOINT_PATTERNS, PATTERN_TOKENS, CORPUS, HEAD_SCORES_BY_PROMPT,
                TRAINING_CURVE_BY_PROMPT, COMPOSITION_BY_PROMPT)
