"""Arbitrary values of the right and wrong shapes in every stored file the workbench reads
back: ``run.json``, a recording's ``index.json``, claims files, head-mask files, a
checkpoint's ``checkpoint.json`` and a cached model's ``manifest.json``.

Properties, for every example: nothing but a one-line :class:`WorkbenchError` is raised
(never a traceback); a bad ``run.json`` damages its own run only; and a stored file is only
ever read inside the folder it belongs to."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.tiny import fake_info
from workbench.core.errors import WorkbenchError
from workbench.harness import claims
from workbench.inputs.prompts import Prompt
from workbench.interventions.masks import HeadMask
from workbench.models import checkpoints, native
from workbench.recording.reader import Recording
from workbench.recording.writer import record
from workbench.store.runs import RUN_JSON, RunStore
from workbench.store.schema import Table, columns, tables

TABLES = tables(Table("t", "one integer column", columns(("a", "int", "a number"))))

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=40) | st.sampled_from(["../x", "/etc/hostname", "\n", "", "."]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def mutations(record: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A record with some fields replaced by arbitrary values, some removed and some added;
    nested objects (one level down) are mutated the same way."""
    keys = sorted(record)

    @st.composite
    def mutate(draw: Any) -> dict[str, Any]:
        out = json.loads(json.dumps(record))
        for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
            if isinstance(out[key], dict) and out[key] and draw(st.booleans()):
                inner = draw(st.sampled_from(sorted(out[key])))
                out[key][inner] = draw(values)
            elif draw(st.booleans()):
                out.pop(key)
            else:
                out[key] = draw(values)
        for key in draw(st.lists(st.text(max_size=10), max_size=2)):
            out[key] = draw(values)
        return out

    return mutate()


def one_line(exc: BaseException) -> None:
    assert isinstance(exc, WorkbenchError), f"{type(exc).__name__}: {exc}"
    assert "\n" not in str(exc) and str(exc)


def as_text(data: Any) -> str:
    return json.dumps(data, allow_nan=True)


@contextlib.contextmanager
def reads_inside(*folders: Path):
    """Fail if a file outside ``folders`` (or the Python installation) is opened."""
    allowed = [os.path.realpath(f) for f in folders]
    real_open = os.open

    def guarded(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        where = os.path.realpath(path) if isinstance(path, (str, os.PathLike)) else ""
        if where and not any(where.startswith(a) for a in allowed) and (
                "site-packages" not in where and "/usr/" not in where):
            raise AssertionError(f"read outside the store: {where}")
        return real_open(path, flags, *args, **kwargs)

    os.open = guarded
    try:
        yield
    finally:
        os.open = real_open


# ---- run.json -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def store_copy(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-runs") / "runs"
    store = RunStore(root)
    ids = []
    for n in (3, 4):
        with store.start("exp", fake_info(), {"n": n}, tables=TABLES) as run:
            run.save_table("t", pd.DataFrame({"a": range(n)}))
        ids.append(run.id)
    return root, ids


@given(data=st.data())
def test_a_bad_run_json_damages_only_its_run(store_copy, tmp_path_factory, data):
    source, (healthy, victim) = store_copy
    root = tmp_path_factory.mktemp("case") / "runs"
    shutil.copytree(source, root)
    original = json.loads((root / victim / RUN_JSON).read_text())
    data_bytes = data.draw(mutations(original).map(as_text).map(str.encode)
                           | st.text(max_size=200).map(str.encode) | st.binary(max_size=200))
    (root / victim / RUN_JSON).write_bytes(data_bytes)
    store = RunStore(root)
    with reads_inside(root):
        listed = {r.id: r for r in store.runs()}
        assert listed[healthy].status == "complete"
        assert list(store.get(healthy).table("t").a) == [0, 1, 2]
        damaged = [r for r in listed.values() if r.status == "damaged"]
        for run in damaged:
            assert run.meta.error and "\n" not in run.meta.error
        for run in listed.values():
            with contextlib.suppress(WorkbenchError):
                run.table("t")
            assert run.meta.summary is not None and isinstance(run.meta.config, dict)


# ---- a recording's index.json -------------------------------------------------------------

@pytest.fixture(scope="module")
def recording(llama, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz-rec") / "rec"
    record(llama, [Prompt(text="the cat sat on the mat"), Prompt(text="a dog")], folder)
    return folder


@given(data=st.data())
def test_a_bad_recording_index_is_one_line_and_nothing_outside_is_read(recording,
                                                                        tmp_path_factory,
                                                                        data):
    folder = tmp_path_factory.mktemp("case") / "rec"
    shutil.copytree(recording, folder)
    index = json.loads((folder / "index.json").read_text())
    (folder / "index.json").write_text(data.draw(mutations(index).map(as_text)))
    with reads_inside(folder):
        try:
            rec = Recording.open(folder)
            for prompt in range(len(rec)):
                rec.tokens(prompt)
                rec.pattern(prompt, 0, 0)
                rec.resid(prompt, 0)
        except Exception as exc:  # asserted to be one clear error
            one_line(exc)


# ---- claims, head masks, checkpoints -------------------------------------------------------

CLAIM = json.loads(as_text({
    "id": "c1", "kind": "reproduction", "paper": "P", "where": "T1", "statement": "s",
    "published": "p", "applies_to": "any", "models": ["m"], "experiment": "head-overview",
    "config": "demo", "check": {"name": "max_score_at_least", "metric": "entropy",
                                "threshold": 0.0}}))


@given(entries=st.lists(mutations(CLAIM), max_size=3) | values)
def test_a_bad_claims_file_is_one_line(tmp_path_factory, entries):
    folder = tmp_path_factory.mktemp("claims")
    (folder / "a.json").write_text(as_text(entries))
    try:
        claims.load_claims(folder)
    except Exception as exc:  # asserted to be one clear error
        one_line(exc)


@given(data=mutations(HeadMask.ones(2, 3, model="m").to_json()) | values)
def test_a_bad_head_mask_is_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("mask") / "mask.json"
    path.write_text(as_text(data))
    try:
        mask = HeadMask.load(path)
    except Exception as exc:  # asserted to be one clear error
        one_line(exc)
    else:
        assert mask.values.shape == (data["n_layers"], data["n_heads"])


@pytest.fixture(scope="module")
def checkpoint(tokenizer, tmp_path_factory):
    run = tmp_path_factory.mktemp("fuzz-ckpt")
    spec = native.ModelSpec(n_layers=1, d_model=16, n_heads=2, n_ctx=32, d_vocab=len(tokenizer))
    tokenizer.save_pretrained(str(run / "tokenizer"))
    checkpoints.save(run, native.build_bridge(spec, tokenizer), spec, step=0, tokens=0)
    return run


@given(data=st.data())
def test_a_bad_checkpoint_json_is_one_line(checkpoint, tmp_path_factory, data):
    run = tmp_path_factory.mktemp("case") / "run"
    shutil.copytree(checkpoint, run)
    folder = checkpoints.step_dir(run, 1, 0)
    meta = json.loads((folder / checkpoints.META).read_text())
    (folder / checkpoints.META).write_text(data.draw(mutations(meta).map(as_text)))
    with reads_inside(run):
        try:
            checkpoints.verify(folder)
        except Exception as exc:  # asserted to be one clear error
            one_line(exc)
