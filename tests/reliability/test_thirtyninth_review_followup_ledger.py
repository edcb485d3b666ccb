"""Issue 15, thirty-ninth hostile review, follow-up of the ledger: regression tests of its findings.

1. A plain Gaussian ``dp-fedavg`` toy run (no tree, no ADADP: none of the lines the ledger
   review's findings 4-5 took as marks of a later version) whose ledger header lost
   ``settings["task-params"]``, then ``task-params.seed`` 0 → 5 in ``config.toml`` and the
   rounds raised, ``simulate --resume``: rc 0, rounds 3-4 trained and evaluated on other users'
   data (accuracy 0.61 → 0.35); ``compare`` reused such a cell alike. A header written before
   task parameters were recorded also lacked ``ema-decay`` (both entered the header in one
   version) and is refused by its settings anyway (measured on a run written by that
   version: ``adadp-alpha-max = "(not set)"`` …). Now every header states what it records
   (``"records"``), and a header without ``task-params`` beside ``ema-decay`` or that field
   is refused (``LedgerChecks._refuse_lost``): exit 2, one line naming the header.
2. A Gaussian run of a task by reference (``task = "mod:make"``) whose header lost ``data``
   (or only ``data.task_source``, the module's source digest), then the module edited (its data
   seed 3 → 4), ``simulate --resume``: rc 0, the run went on with the edited module's data
   (``check_data`` took the header as one written before data, or the task's code, was
   recorded). Now refused by the header's ``records``: exit 2, one line. Headers written by
   the versions before (no ``records``; measured: runs written at 3f84862^ and 0166fb2^ of a
   task by reference) still resume.
3. The residue of 2 for a tree run: a seeded tree run of a task by reference (restart 3, 2
   rounds) whose ledger was rewritten in the form ``RunLedger.convert`` writes (one
   ``carried`` line holding the period's event, no participants, no digests), its header's
   ``records`` and ``data`` deleted, the module edited, ``simulate --resume``: rc 0, round 3
   of the period released on the edited module's data (the once-a-period bound is by user
   index). Now a tree ledger whose header lacks ``data`` (or ``task_source``) while the task
   has one is refused with no mark (``LedgerChecks._refuse_lost``): exit 2, one line.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation.files import LEDGER_FILE, read_rows
from fedprivopt.simulation.run import simulate
from tests.reliability.test_fortieth_review_followup_ledger import as_earlier_checkpoints
from tests.reliability.test_ledger import kept_files
from tests.simulation.test_run import small_config

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def _edit_header(run: Path, edit) -> Path:
    path = run / LEDGER_FILE
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    edit(header)
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    return path


def _refused(run: Path, capsys, *expected: str) -> None:
    files = kept_files(run)
    capsys.readouterr()
    rc = main(["simulate", "--resume", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    assert kept_files(run) == files


# -- 1: a Gaussian run's header that lost its task-params -----------------------------------------
def test_1_a_gaussian_header_that_lost_its_task_params_is_refused(tmp_path, capsys):
    run = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    path = _edit_header(run, lambda h: h["settings"].pop("task-params"))
    config = (run / "config.toml").read_text()
    head, task = config.split("[task-params]")
    assert "num-server-rounds = 2" in head and "\nseed = 0\n" in task
    head = head.replace("num-server-rounds = 2", "num-server-rounds = 3")
    (run / "config.toml").write_text(head + "[task-params]" + task.replace("seed = 0", "seed = 5"))
    _refused(run, capsys, f"{path}: line 1: its header lacks settings.task-params, but its header")
    assert [r["round"] for r in read_rows(run / "metrics.jsonl")] == [1, 2]  # was 1, 2, 3

    def older(header):  # what a header written before task-params lacked too
        del header["records"], header["settings"]["ema-decay"]

    _edit_header(run, older)
    _refused(run, capsys, "ema-decay = 0.0, but the run's privacy ledger records ema-decay")


# -- 2: a task by reference whose header lost its data identity -----------------------------------
WRAP = """
    from fedprivopt.models.toy import ToyClassificationTask

    def make(num_users=40, seed=0):
        return ToyClassificationTask(num_users=num_users, dim=4, seed={seed})
"""


def _wrapped_run(tmp_path, *extra: str) -> Path:
    """A 2-round run of ``review39f_wrap:make`` (data seed 3), its module then edited (seed 4)."""
    folder = tmp_path / "modules"
    folder.mkdir()
    module = folder / "review39f_wrap.py"
    module.write_text(textwrap.dedent(WRAP.format(seed=3)))
    run = tmp_path / "run"
    args = ["simulate", str(TOY), "--rounds", "2", "--out", str(run), "--quiet", *extra]
    assert main([*args, "--set", "task=review39f_wrap:make"]) == 0
    config = run / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 2", "num-server-rounds = 3"))
    module.write_text(textwrap.dedent(WRAP.format(seed=4)))
    sys.modules.pop("review39f_wrap", None)
    return run


@pytest.fixture
def wrapped(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    try:
        yield _wrapped_run(tmp_path)
    finally:
        sys.modules.pop("review39f_wrap", None)


def test_2_a_gaussian_header_that_lost_its_data_is_refused(wrapped, capsys):
    path = _edit_header(wrapped, lambda h: h.pop("data"))
    _refused(wrapped, capsys, f"{path}: line 1: its header lacks data, but its header's records")


def test_2_a_gaussian_header_that_lost_its_task_source_is_refused(wrapped, capsys):
    path = _edit_header(wrapped, lambda h: h["data"].pop("task_source"))
    _refused(wrapped, capsys, f"{path}: line 1: its header lacks data.task_source, but its")


def test_2_a_header_of_the_versions_before_records_still_resumes(wrapped, capsys):
    def older(header):  # a task by reference's header before 0166fb2: no data, no records
        del header["records"], header["data"]

    _edit_header(wrapped, older)
    as_earlier_checkpoints(wrapped)  # fortieth review follow-up (ledger 5): no copy of the header
    assert main(["simulate", "--resume", str(wrapped), "--quiet"]) == 0
    assert [r["round"] for r in read_rows(wrapped / "metrics.jsonl")] == [1, 2, 3]


# -- 3: a tree run's ledger rewritten in a rebuilt ledger's form ----------------------------------
def test_3_a_tree_ledger_in_the_rebuilt_form_without_data_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    tree = ["--set", "noise-mechanism=tree", "--set", "tree-restart-rounds=3"]
    try:
        run = _wrapped_run(tmp_path, *tree)
        path = run / LEDGER_FILE
        header, *lines = (json.loads(x) for x in path.read_text().splitlines())
        del header["records"], header["data"]
        released = [x for line in lines for x in line["released"]]  # the period's event
        carried = {"kind": "carried", "round": 2, "events": 1, "accountant": "rdp",
                   "released": released, "source": "checkpoint.pt (no ledger)"}  # fmt: skip
        path.write_text(json.dumps(header) + "\n" + json.dumps(carried) + "\n")
        _refused(run, capsys, f"{path}: line 1: its header lacks data, and its events are tree")
    finally:
        sys.modules.pop("review39f_wrap", None)
