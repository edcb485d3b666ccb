"""Issue 15, thirty-second hostile review (the privacy contract in real runs): its findings.

The review instrumented real runs of every strategy through the Python API (the noised mean of
each round recomputed from the cohort's clipped updates and the seeded server noise; ε of the
ledger against dp-accounting over the events that happened; empty cohorts, failed and NaN
updates, distributed-noise shares). What did not hold:

1. A task's own ``cohort_trainer`` (a documented extension, ``docs/TASKS.md``) whose
   ``train_batches`` yielded a chunk twice, or users it was not asked for, had them summed:
   ``simulate toy.toml --set task=duptask:make`` (a toy task whose trainer yields its chunk
   twice) ended rc 0 with ``received`` and ``accepted`` 18 for a cohort of 9, every user's
   update summed twice (sensitivity 2C under an ε of 10.28 accounted for C); a trainer that
   added three unsampled users released them without the subsampling the accountant assumes.
   The twenty-sixth review checked a streamed cohort's keys, not the users its entries carry.
   Now ``ServerAlgorithm.aggregate`` refuses, before the round's noise is drawn, a streamed
   entry of a user yielded twice, out of user order or not in the round's cohort: rc 2, one
   line (``round 1's streamed updates hold user 0 twice: ...``), nothing released or kept.
2. With adaptive clipping, a cohort trainer that yielded fewer users than it was asked for (one
   skipped, say for having no examples) had the skipped user counted as a reply whose clip bit
   was invalid: the round's metrics said ``accepted`` 7 and ``rejected`` 1 (``{0: 'clip bit
   must be one finite number'}``) where 8 updates were received and summed and none rejected
   (the noised count itself left the user out). The count now takes the users that were
   yielded: ``accepted`` 8, ``rejected`` 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.clients.trainer import LocalTrainer
from fedprivopt.models.next_word_cohort import DenseUpdates
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.simulation.run import build_run
from fedprivopt.strategies.core import drive_round

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"
REF = "tests.reliability.test_thirtysecond_review_contract:make_task"


class _Trainer:
    """A cohort trainer of one's own: dense updates of the users asked, with a chosen bug."""

    def __init__(self, task: ToyClassificationTask, bug: str) -> None:
        self.local = LocalTrainer(task, device="cpu")
        self.bug = bug

    def _batch(self, users, params, kwargs) -> DenseUpdates:
        deltas = [self.local.train(params, user_id=u, **kwargs).delta for u in users]
        return DenseUpdates(tuple(users), torch.stack(deltas), tuple(1.0 for _ in users))

    def train_batches(self, params, users, *, round_num, config, rngs, preconditioner=None,
                      stream="train"):  # fmt: skip
        kwargs = {"round_num": round_num, "config": config, "rngs": rngs, "stream": stream,
                  "preconditioner": preconditioner}  # fmt: skip
        users = list(users)[1:] if self.bug == "skip" else list(users)
        if not users:
            return
        batch = self._batch(users, params, kwargs)
        yield batch
        if self.bug == "twice":
            yield batch
        elif self.bug == "unasked":
            extra = [u for u in range(40) if u not in users][:3]
            yield self._batch(extra, params, kwargs)


class _Task(ToyClassificationTask):
    def __init__(self, bug: str = "none", **kwargs) -> None:
        super().__init__(**kwargs)
        self.bug = bug

    def cohort_trainer(self, *, device: str, chunk_users: int) -> _Trainer:
        return _Trainer(self, self.bug)


def make_task(bug: str = "none", **kwargs) -> _Task:
    """The factory ``task = REF`` names."""
    return _Task(bug, **kwargs)


def _round(bug: str, **overrides):
    overrides = {"num-server-rounds": 1, "task": REF, "task-params.bug": bug, **overrides}
    cfg = load_config(TOY, overrides)
    task, alg = build_run(cfg)
    train = make_cohort_train(task, device="cpu", vectorize=True)
    return alg, train


@pytest.mark.parametrize(
    ("bug", "why"), [("twice", "twice"), ("unasked", "not in the round's cohort")]
)
def test_1_a_cohort_trainer_yielding_a_user_twice_or_unasked_releases_nothing(bug, why):
    alg, train = _round(bug)
    before = alg.params.clone()
    with pytest.raises(ValueError, match=f"round 1's streamed updates hold user .*{why}"):
        drive_round(alg, 1, train)
    assert alg.round_num == 0 and alg.accountant.state_dict()["ledger"] == []
    assert torch.equal(alg.params, before)


def test_1_a_correct_cohort_trainer_sums_each_user_once():
    alg, train = _round("none")
    result = drive_round(alg, 1, train)
    assert result.metrics["accepted"] == result.metrics["cohort_size"] > 0


def test_1_simulate_refuses_in_one_line_and_keeps_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", str(TOY), "--rounds", "1", "--out", str(out), "--quiet",
               "--set", f"task={REF}", "--set", "task-params.bug=twice"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "streamed updates hold user" in err[0] and "twice" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("adaptive", [False, True])
def test_2_a_user_the_cohort_trainer_skipped_is_neither_accepted_nor_rejected(adaptive):
    alg, train = _round("skip", **{"adaptive-clipping": adaptive})
    result = drive_round(alg, 1, train)
    m = result.metrics
    assert m["received"] == m["accepted"] == m["cohort_size"] - 1
    assert m["rejected"] == 0 and result.rejected == {}
