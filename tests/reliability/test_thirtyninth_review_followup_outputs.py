"""Issue 15, thirty-ninth hostile review, follow-up of the outputs (reports, processes): tests.

1. ``compare toy.toml --strategies dp-fedavg --seeds 2 --rounds 2 --out C``, then seed 0's
   ``metrics.jsonl`` copied over seed 1's, then the same ``compare`` (the reports reviewer's
   open row). Before: rc 0, both cells reused, the row ``0.6133 ± 0.0`` over 2 seeds (the true
   pair ``0.6117 ± 0.0024``): a checkpoint kept only the count of the rows written before it,
   and nothing bound the rows to their run (``audit_run_dir``, ``load_run`` and ``resume``
   took them). Now every checkpoint and ``summary.json`` record the SHA-256 of the rows written
   before them (``checkpoint.RowsDigest``, key ``rows_sha256``; the rows one a round in round
   order, so that reordered rows resume as the twenty-seventh review made them), which
   ``audit_run_dir`` checks (``checkpoint.check_rows_digest``: ``compare``'s reuse,
   ``compare-tuned --untuned``, ``--resume``: refused naming ``metrics.jsonl`` and the file it
   disagrees with) and a report notes (``rundata_summary.check_rows``, a warning, as the reports
   note
   files that state different ε), also with the summary's digest deleted or the summary copied
   with the rows. Honest runs, a resume after a row torn by a kill, and files of earlier
   versions (no digest) are taken as before, without a warning.
2. ``make_node_key(D, "x" * 240)`` (one file name: ``<name>`` and ``<name>.pub`` fit the file
   system's 255 bytes). Before: the processes reviewer's ``tls._write`` (finding 1) wrote each
   file to ``.<name>.<pid>.<hex>.tmp`` first, 25 bytes longer: ``OSError: [Errno 36] File name
   too long``, where the key pair was written before that change. Now the temporary file's
   name does not carry the file's: the pair is written, mode 0600 for the private key, and no
   temporary file is left.
"""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
import torch

from fedprivopt.deploy.tls import make_node_key
from fedprivopt.simulation.audit import audit_run_dir
from fedprivopt.simulation.checkpoint import load_checkpoint, state_digest
from fedprivopt.simulation.files import CHECKPOINT, METRICS_FILE, SUMMARY_FILE, read_rows
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.rundata import load_run
from tests.simulation.test_run import small_config

ROWS_DIGEST = "rows_sha256"  # of a checkpoint and summary.json (checkpoint.ROWS_DIGEST)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """Two finished 2-round runs of the same configuration but their seeds (0 and 1)."""
    root = tmp_path_factory.mktemp("seeds")
    for seed in (0, 1):
        simulate(small_config(**{"num-server-rounds": 2, "seed": seed}), root / f"s{seed}")
    return root


def _copy(seeds, tmp_path):
    """Seed 1's run directory, its ``metrics.jsonl`` replaced by seed 0's."""
    run = tmp_path / "s1"
    shutil.copytree(seeds / "s1", run)
    shutil.copy(seeds / "s0" / METRICS_FILE, run / METRICS_FILE)
    return run


def _earlier_version(run):
    """Strip the rows' digest from the run's checkpoints and summary, as earlier versions wrote."""
    for name in (CHECKPOINT, "checkpoint.prev.pt"):
        if (run / name).exists():
            state = torch.load(run / name, weights_only=True)
            state.pop(ROWS_DIGEST, None)
            state["sha256"] = state_digest(state)
            torch.save(state, run / name)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    summary.pop(ROWS_DIGEST, None)
    (run / SUMMARY_FILE).write_text(json.dumps(summary))


@pytest.mark.parametrize("summary", ["kept", "digest deleted", "copied too"])
def test_1_another_runs_rows_are_refused(seeds, tmp_path, summary):
    run = _copy(seeds, tmp_path)
    if summary == "digest deleted":
        stated = json.loads((run / SUMMARY_FILE).read_text())
        stated.pop(ROWS_DIGEST, None)
        (run / SUMMARY_FILE).write_text(json.dumps(stated))
    elif summary == "copied too":
        shutil.copy(seeds / "s0" / SUMMARY_FILE, run / SUMMARY_FILE)
    noted = [w for w in load_run(run).warnings if "SHA-256 differs" in w]  # write_report's input
    assert len(noted) == 1 and f"{run / METRICS_FILE}: its " in noted[0], noted
    with pytest.raises(ValueError, match=r"metrics\.jsonl: its first 2 rows .* checkpoint\.pt"):
        audit_run_dir(run, engine=False)  # compare's reuse, compare-tuned --untuned, --resume


def test_1_a_summary_digest_that_is_no_digest_is_refused(seeds, tmp_path):
    run = tmp_path / "s1"
    shutil.copytree(seeds / "s1", run)
    stated = json.loads((run / SUMMARY_FILE).read_text())
    stated[ROWS_DIGEST] = 5
    (run / SUMMARY_FILE).write_text(json.dumps(stated))
    assert any("summary.json: rows_sha256 must be a SHA-256" in w for w in load_run(run).warnings)


def test_1_honest_runs_resumes_and_earlier_versions_are_taken(seeds, tmp_path):
    honest = load_run(seeds / "s1")
    assert honest.rows == read_rows(seeds / "s1" / METRICS_FILE) and not honest.warnings
    audit_run_dir(seeds / "s1", engine=False)
    # a resume to 3 rounds after a kill mid-row (the torn line is dropped), then reported
    run = tmp_path / "s1"
    shutil.copytree(seeds / "s1", run)
    text = (
        (run / "config.toml").read_text().replace("num-server-rounds = 2", "num-server-rounds = 3")
    )
    (run / "config.toml").write_text(text)
    with (run / METRICS_FILE).open("a") as fh:
        fh.write('{"round": 3, "epsil')
    (run / SUMMARY_FILE).unlink()
    assert resume(run).rounds_completed == 3
    resumed = load_run(run)
    assert [r["round"] for r in resumed.rows] == [1, 2, 3] and not resumed.warnings
    assert (
        load_checkpoint(run)[ROWS_DIGEST]
        == json.loads((run / SUMMARY_FILE).read_text())[ROWS_DIGEST]
    )
    # files of an earlier version (no digest): reported and audited as before
    old = tmp_path / "old"
    shutil.copytree(seeds / "s0", old)
    _earlier_version(old)
    earlier = load_run(old)
    assert len(earlier.rows) == 2 and not earlier.warnings
    audit_run_dir(old, engine=False)


def test_2_a_node_key_of_a_long_name_is_written(tmp_path):
    name = "x" * 240
    key = make_node_key(tmp_path, name)
    assert sorted(os.listdir(tmp_path)) == [name, name + ".pub"]  # no temporary file left
    assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600
    assert (tmp_path / name).read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY")
    assert key is not None
