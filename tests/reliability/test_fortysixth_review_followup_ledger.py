"""Issue 15, forty-sixth hostile review, follow-up (ledger: the ledger, resume and report fixes).

1. The first wave's open row (ledger, for the owner of ``simulation/tensorboard.py``):
   ``simulate toy.toml --rounds 1 --tensorboard --out R``, then ``touch
   'R/events.out.tfevents.²'`` (a name whose time field is a superscript digit, which
   ``str.isdigit`` takes for a digit and ``int`` refuses), ``num-server-rounds = 2`` in
   ``R/config.toml``, ``simulate --resume R``. Before: rc 2, one line naming nothing
   (``invalid literal for int() with base 10: '²'``), after ``summary.json`` was removed.
   Now ``tensorboard._newest_seconds`` reads only ASCII digits (such a name is not one
   TensorBoard writes, and is left as it is): the resume runs round 2, as without the file.
"""

from __future__ import annotations

from pathlib import Path

from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import CONFIG_FILE, SUMMARY_FILE
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundata import load_run

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = {"population": 12, "task-params.num-users": 12}


def test_1_an_event_file_named_with_another_digit_does_not_stop_a_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    simulate(load_config(TOY, {**SMALL, "num-server-rounds": 1, "tensorboard": True}), run)
    odd = run / "events.out.tfevents.\u00b2"
    odd.touch()
    config = (run / CONFIG_FILE).read_text(encoding="utf-8")
    assert "num-server-rounds = 1\n" in config
    (run / CONFIG_FILE).write_text(
        config.replace("num-server-rounds = 1\n", "num-server-rounds = 2\n"), encoding="utf-8"
    )
    resume(run)  # before: ValueError: invalid literal for int() with base 10: '²'
    assert (run / SUMMARY_FILE).is_file() and load_run(run).rounds_completed == 2
    assert odd.exists()  # not ours to remove
    ours = [p.name for p in run.iterdir() if p.name.startswith("events.out.tfevents.")]
    assert len(ours) == 3 and all(n.split(".")[3].isascii() for n in ours if n != odd.name)

