"""Every published claim in data/claims is well-formed and runnable."""

from __future__ import annotations

import pytest

from tests.unit.test_cli import cli
from workbench.core.paths import data_dir
from workbench.harness import claims
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import discover, get

ALL = claims.load_claims()


def test_claim_ids_are_unique_and_checks_exist():
    discover()
    claims.ensure_checks_exist(ALL)
    assert len({c.id for c in ALL}) == len(ALL) > 0


@pytest.mark.parametrize("claim", ALL, ids=[c.id for c in ALL])
def test_claim_names_a_registered_experiment_with_a_valid_config(claim):
    experiment = get(claim.experiment)
    apply_overrides(experiment.config, claims.claim_config(claim))
    assert claim.paper and claim.statement and claim.published
    assert isinstance(claim.models, tuple)


# mathematical properties that hold for any such model: kept as regression tests, never
# counted as reproduced findings
INVARIANTS = {"gu2024-repeated-token-identical-states",
              "gemma3-sliding-layers-zero-beyond-window"} | {
    c.id for c in claims.read_claims_file(data_dir() / "claims" / "permutation_equivariance.json")
} | {"ioi-direct-effects-sum-to-the-logit-difference",
     "ioi-patching-everything-restores-the-clean-run",
     "ioi-patching-nothing-leaves-the-corrupted-run", "logit-lens-last-boundary-is-the-output",
     "logit-lens-direct-effects-sum-to-the-logit",
     "mueller2025-empty-circuit-is-corrupted-run"}


def test_theorems_are_invariants_and_findings_are_reproductions():
    assert {c.id for c in ALL if c.kind == "invariant"} == INVARIANTS
    for c in ALL:
        assert c.kind in claims.KINDS
        if c.kind == "reproduction":  # a paper's finding names where the paper reports it
            assert c.where, c.id
        assert c.quote == c.quote.strip() and '"' not in c.quote, c.id


def test_reproduce_list_and_unknown_claims(capsys):
    status, out, _ = cli(capsys, "reproduce", "--list")
    text = "\n".join(out)
    assert status == 0 and sum(c.id in text for c in ALL) == len(ALL)
    # a row per claim and model (id, kind, model; "-" for none), the statement below it
    rows = {tuple(line.split()[:3]) for line in out[2:] if line[:1] not in ("", " ")}
    assert rows >= {(c.id, c.kind, m) for c in ALL for m in (c.models or ["-"])}
    assert max(len(line) for line in out) <= 100  # narrow: the statement wraps below
    status, _, err = cli(capsys, "reproduce", "no-such-claim")
    assert status == 2 and "known claims:" in err
