"""Issue 15, fortieth review follow-up, ledger and reports: regression tests of its findings.

1. (the fortieth review ledger reviewer's open row) A seeded tree run whose cohort came short in
   a round without a metrics row (a deployment with nodes missing; here ``TreeCohorts.cohort``
   given 3 available users in round 1), restart 3, ``eval-every = 2``, 2 rounds, rounds raised,
   ``simulate --resume``: rc 2, ``checkpoint.pt's tree participation ledger holds 7 users of
   restart period 0, but its rounds 1-2 drew 8 (4 a round): the checkpoint was edited``: a
   genuine run refused (a missing row was taken as a full cohort). Now, where the ledger's line
   of the checkpoint's round records the period's participants (``participants_sha256``, which
   ``check_participants`` compares exactly), a count between the rows' and the rows' plus a full
   cohort a missing row is taken (``audit._check_participants``): rc 0. The participants emptied
   (the ledger's digest no longer matches) or the ledger deleted: still refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.privacy import tree
from fedprivopt.simulation.checkpoint import state_digest
from fedprivopt.simulation.files import LEDGER_FILE
from fedprivopt.simulation.run import simulate
from tests.simulation.test_run import small_config


def _raise_rounds(run: Path, rounds: int) -> None:
    config = run / "config.toml"
    text = config.read_text()
    assert f"num-server-rounds = {rounds - 1}" in text
    config.write_text(
        text.replace(f"num-server-rounds = {rounds - 1}", f"num-server-rounds = {rounds}")
    )


# -- 1: a tree run whose cohort came short in a round without a metrics row ------------------------
@pytest.fixture(scope="module")
def short_cohort_run(tmp_path_factory) -> Path:
    """A seeded tree run (restart 3, eval-every 2, 2 rounds) whose round 1 drew 3 of 4 users."""
    original = tree.TreeCohorts.cohort

    def cohort(self, round_num, available=None):
        if round_num == 1:  # one user of the cohort unreachable in round 1
            period, _ = tree.tree_position(round_num, self.restart_rounds)
            available = torch.zeros(self.population, dtype=torch.bool)
            available[self.order(period)[:3]] = True
        return original(self, round_num, available)

    config = small_config(
        **{"num-server-rounds": 2, "noise-mechanism": "tree", "tree-restart-rounds": 3,
           "eval-every": 2}
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tree.TreeCohorts, "cohort", cohort)
        return simulate(config, tmp_path_factory.mktemp("short") / "run").out_dir


def test_1_a_tree_run_whose_cohort_came_short_without_a_row_resumes(
    short_cohort_run, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(short_cohort_run, run)
    _raise_rounds(run, 3)
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 0, capsys.readouterr().err


def _cut_participants(run: Path, keep: int) -> None:
    """Keep the first ``keep`` participants of the checkpoint's period; recompute its digest."""
    path = run / "checkpoint.pt"
    state = torch.load(path, weights_only=False)
    cohorts = state["algorithm"]["tree"]["cohorts"]
    assert cohorts["users"].numel() == 7  # rounds 1-2 drew 3 and 4
    cohorts["users"] = cohorts["users"][:keep]
    del state["sha256"]
    state["sha256"] = state_digest(state)
    torch.save(state, path)


@pytest.mark.parametrize("keep", [6, 2])
def test_1_its_participants_cut_or_its_ledger_deleted_are_still_refused(
    short_cohort_run, tmp_path, capsys, keep
):
    run = tmp_path / "run"
    shutil.copytree(short_cohort_run, run)
    _raise_rounds(run, 3)
    _cut_participants(run, keep)  # between the row's 4 and 8, and below it
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"holds {keep} users of restart period 0" in err and "edited" in err, err
    run = tmp_path / "deleted"
    shutil.copytree(short_cohort_run, run)
    _raise_rounds(run, 3)
    (run / LEDGER_FILE).unlink()  # nothing records the participants: a full cohort is assumed
    assert main(["simulate", "--resume", str(run), "--quiet"]) == 2
    assert "holds 7 users of restart period 0" in capsys.readouterr().err
