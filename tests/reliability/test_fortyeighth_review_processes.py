"""Issue 15, forty-eighth hostile review (processes: signals, kills, locks, run processes): tests.

1. A SIGTERM, SIGHUP or Ctrl-C of ``simulate`` (the fast engine) that comes after a round's
   ledger line was written and before its checkpoint was saved (the metrics row's write and
   fsync, the checkpoint's own write: on the toy preset 2 of 6 Ctrl-C's at a random moment of
   ``simulate toy.toml --rounds 400 --set secure=true --set noise-mechanism=tree``). The round
   was charged and its model existed, but the run stopped without saving it: a secure tree run
   could then never be resumed (``it cannot be resumed (... rounds 5-5 were released after the
   checkpoint ...): start a new run``), and a secure Gaussian run's ``--resume`` released the
   round again with new noise, charged twice. Now ``RunWriter.on_round`` holds an ending
   signal back from before the round's ledger line until its checkpoint is saved
   (``interrupt.held``), then sends it again to the handler that was in place (the command's,
   Python's Ctrl-C, Flower's in a deployment's ServerApp): the run stops at that checkpoint and
   ``--resume`` goes on from it, as after an uninterrupted round.
2. The same for the checkpoint a run saves after its engine returned (a run stopped by its
   budget at a round that ``checkpoint-every`` does not save): ``simulate toy.toml --set
   secure=true --set checkpoint-every=2 --set target-epsilon=13`` (stops after round 3, epsilon
   12.17), Ctrl-C during that save. Before: ``--resume`` ended at round 2's checkpoint (the
   budget allows no redo of round 3): ``2 rounds (budget)`` with the epsilon of the 3 rounds
   released, round 3's model lost. Now that save is held too (``run._execute``): 3 rounds.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from fedprivopt.simulation import interrupt
from fedprivopt.simulation import writer as writer_module
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import METRICS_FILE
from fedprivopt.simulation.ledger import RunLedger
from fedprivopt.simulation.run import resume, simulate

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


# -- finding 1: a signal between a round's ledger line and its checkpoint --------------------


def _signalled_after_row(monkeypatch, signum: int, round_num: int) -> None:
    """Send ``signum`` to this process as round ``round_num``'s metrics row is written."""
    original = writer_module.write_synced
    rows = []

    def write(path, data, mode="w"):
        original(path, data, mode)
        if Path(path).name == METRICS_FILE:
            rows.append(path)
            if len(rows) == round_num:
                os.kill(os.getpid(), signum)

    monkeypatch.setattr(writer_module, "write_synced", write)


@pytest.mark.parametrize(
    ("mechanism", "signum"),
    [("tree", signal.SIGTERM), ("gaussian", signal.SIGHUP), ("gaussian", signal.SIGINT)],
)
def test_1_a_signal_after_the_ledger_line_stops_at_the_rounds_checkpoint(
    tmp_path, monkeypatch, mechanism, signum
):
    over = {"num-server-rounds": 3, "secure": True, "noise-mechanism": mechanism}
    if mechanism == "tree":
        over["noise-multiplier"] = 1.5
    config = load_config(TOY, over)
    straight = simulate(config, tmp_path / "straight")
    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        _signalled_after_row(patched, signum, 2)
        with pytest.raises(interrupt.Interrupted) as stopped:
            simulate(config, out)
    assert stopped.value.signum == signum and stopped.value.out_dir == out
    assert RunLedger.read(out).last_round == 2
    outcome = resume(out)  # before: tree refused (round 2 released after the checkpoint)
    assert outcome.rounds_completed == 3
    # before: round 2 released again with new noise and charged twice (gaussian)
    assert outcome.epsilon == pytest.approx(straight.epsilon, rel=1e-12)
    assert [e.round for e in RunLedger.read(out).entries] == [1, 2, 3]


def test_1_a_held_signal_reaches_the_handler_that_was_in_place():
    """A deployment's ServerApp keeps Flower's handler: it runs once the round is saved."""
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with interrupt.held():
            os.kill(os.getpid(), signal.SIGTERM)
            assert seen == []  # held while the round is recorded
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- finding 2: a signal during the checkpoint saved after the engine returned ---------------


def test_2_a_signal_during_the_last_save_of_a_budget_stop_keeps_its_round(tmp_path, monkeypatch):
    over = {"num-server-rounds": 10, "secure": True, "checkpoint-every": 2}
    config = load_config(TOY, {**over, "target-epsilon": 13.0})  # stops after round 3
    original = writer_module.save_checkpoint

    def save(out, state, *args, **kwargs):
        if state["round"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return original(out, state, *args, **kwargs)

    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(writer_module, "save_checkpoint", save)
        with pytest.raises(interrupt.Interrupted):
            simulate(config, out)
    assert RunLedger.read(out).last_round == 3
    outcome = resume(out)
    assert (outcome.rounds_completed, outcome.stopped_reason) == (3, "budget")  # before: 2
