"""Follow-up of the forty-sixth review of issue 15: outputs (input and processes fixes).

1. ``simulation.run.simulate(load_config('simulations/toy.toml'), 'C/x')`` (the Python API)
   while ``compare ... --out C`` runs (``tune --out T`` alike; the processes reviewer's open
   row, the forty-fifth review's lead 3 through the API). Before: a whole run written into
   ``C/x`` among the comparison's files, where ``simulate --out C/x`` refuses it (rc 2, naming
   the PID). Now: ``simulate`` makes the command line's check
   (``run_places.refuse_inside_writing``, moved there from ``deploy.out_checks``, which
   re-exports it): ``LockHeldError`` naming ``out_dir`` and the holder's PID, nothing written;
   a comparison's own cells (in its process, or in its ``--jobs`` workers) pass as before.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedprivopt.cli import main

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"

_HOLDER = """
import fcntl, os, sys, time
d = sys.argv[1]
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
f = open(os.path.join(d, sys.argv[2]), "w")
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
f.write(str(os.getpid())); f.flush()
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("lock, inside", [("compare.lock", "x"), ("tune.lock", "runs/t")])
def test_1_the_python_api_refuses_a_run_inside_a_running_comparison(tmp_path, capsys, lock, inside):
    from fedprivopt.data.locks import LockHeldError
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate

    out = tmp_path / "C"
    (out / "runs").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(out), lock], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        config = load_config(TOY, {"num-server-rounds": 1})
        with pytest.raises(LockHeldError, match=rf"argument out_dir: .* process {holder.pid} is"):
            simulate(config, out / inside)
        # the command line's message as before
        code = main(["simulate", str(TOY), "--rounds", "1", "--out", str(out / inside)])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"argument --out: {out / inside} is inside the " in err
    assert f"process {holder.pid} is writing: choose a directory outside it" in err, err
    assert sorted(p.name for p in out.iterdir()) == sorted([lock, "runs"])
    assert list((out / "runs").iterdir()) == []

