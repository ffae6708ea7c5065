"""Every published claim in data/claims is well-formed and runnable."""

from __future__ import annotations

import pytest

from tests.unit.test_cli import cli
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


def test_reproduce_list_and_unknown_claims(capsys):
    status, out, _ = cli(capsys, "reproduce", "--list")
    assert status == 0 and sum(c.id in "\n".join(out) for c in ALL) == len(ALL)
    status, _, err = cli(capsys, "reproduce", "no-such-claim")
    assert status == 2 and "known claims:" in err
