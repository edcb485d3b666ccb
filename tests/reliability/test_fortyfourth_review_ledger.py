"""Issue 15, forty-fourth hostile review (ledger: the ledger, checkpoints, every reader): tests.

1. ``tune toy.toml --grid server-learning-rate=0.5,1 --mean-trials 1 --rounds 1 --seed 3 --out
   T``, then trial-001's ``checkpoint.pt`` replaced by a FIFO (``mkfifo``; also
   ``checkpoint.prev.pt`` behind a torn ``checkpoint.pt``), then ``compare-tuned T --out O``.
   Before: blocked for ever (killed by ``timeout 60``, rc 124): ``tune_trials._check_covered``
   reads the trial's checkpoint accountant through ``newest_checkpoint``, which gave the FIFO to
   ``torch.load``, where ``--resume``, ``compare`` and ``load_run`` refuse it first
   (``files.check_run_files``, ninth review). The secure tree run's interruption line
   (``audit_tree.secure_tree_redo``) read it alike. Now ``newest_checkpoint`` refuses a
   checkpoint that is no regular file before it opens it: rc 2, ``T/runs/trial-001/checkpoint.pt:
   not a regular file (a FIFO, device or socket) ...``.
2. ``simulate toy.toml --set secure=true --set checkpoint-every=2 --tensorboard --rounds 4``
   killed after round 3's row (its checkpoint of round 2), ``tensorboard = false`` set in its
   ``config.toml`` (an execution setting a resume may change), then ``simulate --resume``.
   Before: rc 0, the rows' round 3 is the redone release (accuracy 0.65), but TensorBoard went
   on showing round 3's first release (0.63) from the killed run's event file: a view of a
   release the run's rows no longer hold. Now ``RunWriter`` purges the event files' steps
   after the restored round when a resume writes no events (``RunWriter._purge_events``: a
   new event file holding only TensorBoard's purge); rounds 1-2 stay shown.
3. ``simulate toy.toml --rounds 3 --set checkpoint-every=2 --out R`` (the last round no
   multiple of ``checkpoint-every``, so the run saves its last checkpoint after the engine
   returns), ``R`` moved away and a new directory made at ``R`` (``mv R R.old``, another
   ``simulate --out R`` starting) while the engine shut down after round 3 (Ray's and Flower's
   shutdown take seconds; forced in process). Before: the run wrote its round-3 checkpoint into
   the new ``R`` (and, when its last round had no row, appended an evaluation row to its
   ``metrics.jsonl``), then stopped at its summary (``was moved or replaced``): another run's
   directory given a checkpoint of this one. Now ``RunWriter.save_checkpoint`` and the last
   round's evaluation check the directory held first (``rundir.check_held``): nothing written.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from fedprivopt.simulation import run as run_module
from fedprivopt.simulation.checkpoint import newest_checkpoint
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import CHECKPOINT, CONFIG_FILE, METRICS_FILE, read_rows
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundata_epsilon import checkpoint_epsilon_header

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {"population": 12, "task-params.num-users": 12}


def _unblock(fifo: Path) -> None:
    """Open ``fifo`` for writing and close it, so that a reader blocked on it sees its end."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    os.close(fd)


@pytest.mark.parametrize("which", ["checkpoint.pt", "checkpoint.prev.pt"])
@pytest.mark.parametrize("reader", ["newest_checkpoint", "checkpoint_epsilon_header"])
def test_1_a_fifo_checkpoint_is_refused_not_read(tmp_path: Path, which: str, reader: str) -> None:
    run = tmp_path / "trial-001"
    run.mkdir()
    if which == "checkpoint.prev.pt":
        (run / "checkpoint.pt").write_bytes(b"PK\x03\x04 torn")  # unreadable: the previous next
    fifo = run / which
    os.mkfifo(fifo)
    call = {
        "newest_checkpoint": lambda: newest_checkpoint(run, {}),
        "checkpoint_epsilon_header": lambda: checkpoint_epsilon_header(run, 1e-4),
    }[reader]
    outcome: list[BaseException | object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(5)
    blocked = thread.is_alive()
    while thread.is_alive():  # before the fix: let the blocked reader go, then fail
        try:
            _unblock(fifo)
        except OSError:  # no reader has it open yet
            pass
        thread.join(0.1)
    assert not blocked, f"{reader} blocked reading a FIFO {which}"
    assert len(outcome) == 1 and isinstance(outcome[0], ValueError), outcome
    assert str(outcome[0]).startswith(f"{fifo}: not a regular file (a FIFO, device or socket)")


def _shown(run: Path) -> dict[int, float]:
    """TensorBoard's view of ``run``'s ``eval_loss``: step -> value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("eval_loss")}


def test_2_a_resume_without_tensorboard_purges_the_redone_rounds_events(tmp_path: Path) -> None:
    run = tmp_path / "run"
    settings = {**SMALL, "num-server-rounds": 4, "secure": True, "checkpoint-every": 2,
                "tensorboard": True}  # fmt: skip
    simulate(load_config(TOY, settings), run)
    first = {r["round"]: r["eval_loss"] for r in read_rows(run / METRICS_FILE)}
    assert _shown(run) == pytest.approx(first)
    # as a kill after round 4's row leaves it: the newest checkpoint is of round 2
    (run / CHECKPOINT).unlink()
    (run / "checkpoint.prev.pt").rename(run / CHECKPOINT)
    (run / "summary.json").unlink()
    config = (run / CONFIG_FILE).read_text(encoding="utf-8")
    (run / CONFIG_FILE).write_text(config.replace("tensorboard = true", "tensorboard = false"))
    resume(run)
    rows = {r["round"]: r["eval_loss"] for r in read_rows(run / METRICS_FILE)}
    assert sorted(rows) == [1, 2, 3, 4] and rows[3] != first[3]  # redone with new noise
    assert _shown(run) == pytest.approx({1: first[1], 2: first[2]})


def test_3_nothing_is_written_into_a_directory_that_replaced_the_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "R"
    engine = run_module.run_fast

    def replaced_after_the_rounds(*args, **kwargs):
        reason = engine(*args, **kwargs)
        run.rename(tmp_path / "R.old")  # mv R R.old, and a new run's directory at R
        run.mkdir()
        return reason

    monkeypatch.setattr(run_module, "run_fast", replaced_after_the_rounds)
    settings = {**SMALL, "num-server-rounds": 3, "checkpoint-every": 2}
    with pytest.raises(ValueError, match="was moved or replaced while this run held it"):
        simulate(load_config(TOY, settings), run)
    assert os.listdir(run) == []  # the other directory: nothing of this run
    assert (tmp_path / "R.old" / CHECKPOINT).is_file()  # the run's own files are where it is
