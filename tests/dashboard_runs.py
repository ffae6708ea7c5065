"""A run store with a complete run of every kind the dashboard's pages show, made with the
tiny models, beside the troubled runs and the secret run outside the store of
:func:`tests.robustness.test_dashboard_paths.hostile_store`: what crafted callback values
are posted against (tests/robustness/test_dashboard_inputs.py, tests/fuzz).

Examples:
    >>> stocked = stocked_store(tmp_path, llama)          # doctest: +SKIP
    >>> stocked.kinds["attention-sinks"]                  # a run id  # doctest: +SKIP
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from dash import Dash
from dash._utils import split_callback_id, stringify_id

from dashboards.components.messages import ERROR_COLOUR
from tests.robustness.test_dashboard_paths import Hostile, hostile_store
from workbench.harness.experiment import run_experiment
from workbench.harness.sweeps import cluster, runner
from workbench.harness.sweeps.spec import expand, parse_spec
from workbench.harness.sweeps.tables import TABLES
from workbench.store.runs import RunStore

TEXT = ("A module is a file containing Python definitions and statements. The module name is "
        "the file name without the suffix. Return the number of items in the container.")
CONFIGS = {
    "head-overview": {"n_boot": 20},
    "previous-token-heads": {"n_prompts": 4, "n_repeated": 4, "n_tokens": 32, "seq_len": 8,
                             "n_boot": 20},
    "induction-heads": {"n_prompts": 4, "n_natural": 2, "n_random": 2, "icl_prompts": 2,
                        "copying_tokens": 20, "n_boot": 20, "seq_len": 8, "n_ablate": 1,
                        "n_track": 1},
    "attention-sinks": {"n_prompts": 4, "seq_len": 16, "stream_tokens": 80, "window": 24,
                        "n_sinks": 4, "sink_sweep": (1,), "chunk": 16, "recompute_stride": 8,
                        "n_massive_prompts": 2, "n_boot": 20},
    "head-pruning": {"fit_tokens": 128, "ablation_tokens": 32, "eval_tokens": 64,
                     "chunk_tokens": 32, "repeat_prompts": 2, "repeat_len": 6, "probes": 2,
                     "step_fraction": 0.25, "max_fraction": 0.75, "n_boot": 20,
                     "speed_repeats": 5, "budgets": (0.25, 0.5), "importance": ("gradient",),
                     "top_k": 2},
    "permutation-equivariance": {"n_prompts": 2, "max_tokens": 10, "seeds": (0, 1),
                                 "shifts": (1, 10), "view_prompts": 2},
    "qk-attribution": {"n_prompts": 3, "seq_len": 8, "n_heads": 2, "n_previous": 1,
                       "n_random": 3, "n_boot": 20, "patch_prompts": 1, "n_patch": 1},
    # the tiny tokenizer's only words that are one token with their leading space
    "ioi": {"names": "and dog on sat the", "places": "dog", "objects": "sat", "n_prompts": 4,
            "templates": 2, "patch_prompts": 2, "n_receivers": 1, "path_patch": False,
            "n_boot": 20},
    "logit-lens": {"prompt_set": "repeated-random", "n_prompts": 2, "read": "all", "n_boot": 20},
    "induction-distance": {"n_prompts": 2, "seq_len": 4, "distances": (4, 8, 16), "n_boot": 20},
    "circuit": {"names": "and dog on sat the", "places": "dog", "objects": "sat", "task": "ioi",
                "n_prompts": 4, "templates": 2, "steps": 2, "n_exact": 3, "n_boot": 20,
                "fractions": (0.05, 0.5, 1.0)},
}
"""The experiments run on the tiny Llama, each with a config small enough for a test."""
FORMATION = {"vocab_size": 320, "d_model": 16, "n_heads": 2, "n_ctx": 40, "steps": 8,
             "checkpoint_every": 4, "batch_size": 4, "warmup_steps": 2, "lr": 0.03,
             "heldout_windows": 4, "icl_early": 5, "icl_late": 36, "icl_band": 2,
             "n_repeat_prompts": 3, "repeat_len": 8, "pattern_len": 6, "n_boot": 20,
             "composition": False, "sources": ()}
SWEPT = {"n_prompts": 3, "n_repeated": 3, "n_tokens": 32, "seq_len": 8, "n_boot": 20}


@dataclass
class Stocked:
    """The hostile store, and the id of one complete run of each kind (experiment)."""

    hostile: Hostile
    kinds: dict[str, str]

    @property
    def runs(self) -> Path:
        return self.hostile.runs


def _sweep(runs: Path, formation: str) -> str:
    """A sweep of previous-token-heads over the checkpoints of one trained model, its cells
    run in this process."""
    spec = parse_spec({"experiments": ["previous-token-heads"],
                       "models": [f"{formation}/L1:*"], "set": SWEPT})
    cells = expand(spec, runs)
    store = RunStore(runs)
    since = datetime.now(UTC).isoformat(timespec="seconds")
    outcomes = {c.index: cluster.run_cell(c, str(runs), "float32", 1, {}) for c in cells}
    with store.start("sweep", None, spec.to_dict(), tables=TABLES) as active:
        runner.record_cells(active, store, cells, outcomes, since)
    return active.id


def stocked_store(root: Path, model) -> Stocked:
    """The hostile store under ``root`` with one complete run of every kind added."""
    hostile = hostile_store(root, model)
    kinds = {"record": hostile.healthy}
    for name, config in CONFIGS.items():
        kinds[name] = run_experiment(name, model, config, runs_dir=hostile.runs).id
    text = root / "text.txt"
    text.write_text("\n\n".join(f"{i}: {TEXT}" for i in range(40)))
    kinds["induction-formation"] = run_experiment(
        "induction-formation", None, {**FORMATION, "text_files": (str(text),)},
        runs_dir=hostile.runs).id
    kinds["sweep"] = _sweep(hostile.runs, kinds["induction-formation"])
    return Stocked(hostile, kinds)


def names_in(stocked: Stocked, per_column: int = 12) -> list[str]:
    """Short texts the runs' tables hold (metric, model, condition, input, order names...),
    the values a page's dropdowns offer, to post where a name belongs."""
    store = RunStore(stocked.runs)
    found: dict[str, None] = {}
    for run_id in stocked.kinds.values():
        run = store.get(run_id)
        for table in run.table_names():
            frame = run.table(table)
            for column in frame.columns:
                if not pd.api.types.is_string_dtype(frame[column]):
                    continue
                texts = pd.unique(frame[column].dropna().astype(str))[:per_column]
                found.update((t, None) for t in texts if len(t) <= 60)
    return list(found)


# ---- posting to a callback as the browser does -------------------------------------------

def _key(item: dict) -> str:
    return f"{item['id']}.{item['property']}"


def _pattern(item: dict) -> dict | None:
    """The id of a pattern-matching input (``{"type": ..., "metric": ["ALL"]}``), else
    ``None``."""
    text = item["id"]
    return json.loads(text) if isinstance(text, str) and text.startswith("{") else None


def _entry(item: dict, value: Any) -> Any:
    """One input or state of the request body; a pattern input is a list of components,
    its value a list of ``(wildcard value, property value)`` pairs."""
    pattern = _pattern(item)
    if pattern is None:
        return {**item, "value": value}
    wild = next(k for k, v in pattern.items() if v == ["ALL"])
    return [{"id": {**pattern, wild: w}, "property": item["property"], "value": v}
            for w, v in (value or [])]


def request_body(app: Dash, key: str, values: dict[str, Any],
                 changed: list[str] | None = None) -> dict:
    """The body the browser posts to run callback ``key``.

    Args:
        app: the app (its callbacks registered).
        key: the callback's key in ``app.callback_map``.
        values: ``id.property`` -> value of its inputs and states (others ``None``).
        changed: the ``changedPropIds`` (default: the first input, as a user's change).
    """
    spec = app.callback_map[key]
    inputs = [_entry(i, values.get(_key(i))) for i in spec["inputs"]]
    state = [_entry(s, values.get(_key(s))) for s in spec["state"]]
    if changed is None:
        first = inputs[0]
        changed = ([f"{stringify_id(c['id'])}.{c['property']}" for c in first[:1]]
                   if isinstance(first, list) else [_key(first)])
    return {"output": key, "outputs": split_callback_id(key), "inputs": inputs, "state": state,
            "changedPropIds": changed}


def post_callback(app: Dash, key: str, values: dict[str, Any],
                  changed: list[str] | None = None) -> tuple[int, str, dict]:
    """Post callback ``key`` (:func:`request_body`); return the status, the response text
    and its ``response`` part."""
    body = request_body(app, key, values, changed)
    response = app.server.test_client().post("/_dash-update-component", json=body)
    text = response.get_data(as_text=True)
    payload = response.get_json(silent=True) if response.status_code == 200 else None
    return response.status_code, text, (payload or {}).get("response", {})


def callback_key(app: Dash, output: str) -> str:
    """The key of the callback whose outputs include ``output`` (``id.property``; an
    output several callbacks write names none of them)."""
    for key in app.callback_map:
        outputs = key[2:-2].split("...") if key.startswith("..") else [key]
        if output in outputs:
            return key
    raise KeyError(output)


def messages_in(response: Any) -> list[str]:
    """Every message a callback's response shows, as the page shows it: ``wb-error``
    lines, and the titles of the empty figures that say why they are empty (Plotly shows
    a title's entities as the characters they stand for)."""
    found: list[str] = []
    if isinstance(response, dict):
        props = response.get("props")
        if isinstance(props, dict) and props.get("className") == "wb-error":
            found.append(props.get("children"))
        layout = response.get("layout")
        title = layout.get("title") if isinstance(layout, dict) else None
        if isinstance(title, dict) and title.get("font", {}).get("color") == ERROR_COLOUR:
            found.append(html.unescape(str(title.get("text"))))
        for value in response.values():
            found += messages_in(value)
    elif isinstance(response, list):
        for value in response:
            found += messages_in(value)
    return found
