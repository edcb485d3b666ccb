"""Issue 15, forty-seventh hostile review, follow-up (outputs: the first wave's input and output
fixes, and its open rows): tests.

1. The processes reviewer's open row: the Python API ``fedprivopt.data.generate(R / "sub",
   SyntheticConfig(num_clients=3), workers=1)`` while another open file holds ``R`` with only
   ``run.lock`` written (a run starting; ``NewRunDir(R)`` held in-process; the test holds
   its ``flock`` as ``rundir.lock_directory`` does). Before: the dataset
   was written into the run (``stackoverflow.sqlite`` and its three companions in ``R/sub``),
   rc 0, where ``data synth --out R/sub`` refuses it. Now ``run_files_around`` (which
   ``generate``, ``data synth`` and a task's generation or token cache ask) knows an ancestor
   holding ``run.lock`` that is held: ``ValueError`` naming it, nothing written; once the run
   let go (``run.lock`` alone, a start's debris) the call writes as before.
"""

from __future__ import annotations

import fcntl
import os

import pytest


def test_1_generate_refuses_a_directory_inside_a_run_that_is_starting(tmp_path):
    from fedprivopt.data import generate
    from fedprivopt.data.synthetic_config import SyntheticConfig
    from fedprivopt.data.synthetic_files import run_files_note

    run = tmp_path / "R"
    run.mkdir()
    (run / "run.lock").write_text(f"{os.getpid()}\n")
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)  # as NewRunDir holds it (lock_directory)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for target in (run / "sub", run / "a" / "b"):
            with pytest.raises(ValueError, match=r"which holds run\.lock \(a run into it starts"):
                generate(target, SyntheticConfig(num_clients=3), workers=1)
            assert not os.path.lexists(target)
        assert "run.lock" in (run_files_note(run / "cache") or "")  # a task's token cache
    finally:
        os.close(fd)
    # let go: run.lock alone (a start's debris) is no run, as before (generate writes there;
    # not called here: its token-store import costs 4 s of torch)
    assert run_files_note(run / "sub") is None
