"""Issue 15, thirty-ninth hostile review (input: bad settings and data files): tests.

1. ``data synth --out D --clients 1000000 --tags 10000 --vocab 200000 --workers 1024``: the
   generator started one worker a chunk of 2,048 users (489 of them), each rebuilding the word
   and tag model and drawing a chunk: about 0.8 GB a worker (8,192 users of 10,000 tags: 797 MB
   a process at most, measured), some 400 GB on a machine of 23 GB; ``--workers`` was bounded
   only by 1,024, and a default count (the CPUs) not at all by the memory. Now
   ``synthetic_config.workers_that_fit`` estimates a worker's memory (``worker_memory``: words,
   tags and a chunk's examples) and refuses a count that starts more processes than the
   machine's memory holds: rc 2, one line ``argument --workers: must be an integer in [1, 37]
   on this machine for this dataset: each worker holds about 637 MiB …``, before anything is
   written; a default count is lowered to what fits (the files are the same for any count).
2. ``epsilon --noise-multiplier 1 --rounds 10 --delta 1e-5 --population 10**400 --cohort 5``
   (also ``--sampling fixed``, and ``calibrate``): rc 2, one line, but ``sample_rate must be in
   (0, 1], got 0.0``, naming a flag that was not given: COHORT/POPULATION underflowed to 0.
   ``cli_privacy._resolve_sampling`` now names ``--population`` and why (``COHORT/POPULATION
   is below the smallest float64 (5e-324), so the rate is 0``), the 401 digits shortened.
3. ``data info D`` (also a task reading ``D``) where ``D/stackoverflow.sqlite-journal`` is a
   FIFO: blocked for ever in SQLite's ``open`` of it, which retries after a signal, so Ctrl-C
   and SIGTERM did not end it (only SIGKILL); a ``-shm`` FIFO: ``disk I/O error``; a ``-wal``
   FIFO was read as an empty log. ``sqlite_files.check_sqlite_file`` (``_check_companions``)
   now refuses a ``-journal``, ``-wal`` or ``-shm`` that is not a regular file (a link to
   ``/dev/zero`` too), naming it, before SQLite opens anything.
"""

from __future__ import annotations

import os

import pytest

from fedprivopt.data import synthetic, synthetic_config
from fedprivopt.data.sqlite_files import check_sqlite_file
from fedprivopt.data.synthetic_config import SyntheticConfig
from tests.reliability.test_thirtyeighth_review_input import _cli


class _Drawn(Exception):
    """Raised where the generator would start drawing chunks."""


@pytest.fixture
def small_machine(monkeypatch):
    """A machine of 2 GiB, and a generator that stops where it would start its workers."""
    monkeypatch.setattr(synthetic_config, "physical_memory", lambda: 2 * 2**30, raising=False)
    started: list[int] = []

    def chunk_rows(config, model, model_seed, chunk_seeds, workers):
        started.append(workers)
        raise _Drawn

    monkeypatch.setattr(synthetic, "chunk_rows", chunk_rows)
    return started


def test_data_synth_refuses_more_workers_than_the_memory_holds(tmp_path, small_machine):
    out = tmp_path / "d"
    code, err = _cli(
        "data", "synth", "--out", str(out), "--clients", "20000", "--tags", "10000",
        "--vocab", "200000", "--workers", "8",
    )  # fmt: skip
    assert code == 2, err
    assert len(err) == 1 and "argument --workers: must be an integer in [1, 3]" in err[0], err
    assert "MiB" in err[0] and "2.0 GiB" in err[0]
    assert not out.exists() and small_machine == []


def test_generate_lowers_its_default_workers_and_refuses_too_many(tmp_path, small_machine):
    config = SyntheticConfig(num_clients=20000, num_tags=10000, vocab_size=200000)
    with pytest.raises(_Drawn):
        synthetic.generate(tmp_path / "a", config, workers=None)
    assert small_machine == [min(3, synthetic.default_workers())]
    with pytest.raises(ValueError, match=r"^workers must be an integer in \[1, 3\]"):
        synthetic.generate(tmp_path / "b", config, workers=8)
    assert not (tmp_path / "b").exists()
    # workers beyond the chunks start no process: 30 users are one chunk
    with pytest.raises(_Drawn):
        synthetic.generate(tmp_path / "c", SyntheticConfig(num_clients=30, vocab_size=400,
                                                           num_tags=20), workers=1000)  # fmt: skip
    assert small_machine[-1] == 1000


@pytest.mark.parametrize("command", ["epsilon", "calibrate"])
@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_a_rate_that_underflows_names_population(command, sampling):
    first = ["--noise-multiplier", "1"] if command == "epsilon" else ["--target-epsilon", "1"]
    code, err = _cli(
        command, *first, "--rounds", "10", "--delta", "1e-5", "--sampling", sampling,
        "--population", str(10**400), "--cohort", "5",
    )  # fmt: skip
    assert code == 2, err
    assert len(err) == 1 and "argument --population: COHORT/POPULATION is below" in err[0], err
    assert "(401 digits)" in err[0] and len(err[0]) < 200


@pytest.mark.parametrize("end", ["-journal", "-wal", "-shm"])
@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_journal_that_is_no_regular_file_is_refused(tmp_path, end, kind):
    db = tmp_path / "stackoverflow.sqlite"
    db.write_bytes(b"SQLite format 3\x00" + bytes(84))
    companion = tmp_path / f"stackoverflow.sqlite{end}"
    if kind == "fifo":
        os.mkfifo(companion)
    elif kind == "device":
        companion.symlink_to("/dev/null")
    else:
        companion.mkdir()
    with pytest.raises(ValueError, match=rf"sqlite{end}: beside stackoverflow.sqlite, and not a"):
        check_sqlite_file(db)
    assert os.path.lexists(companion)  # left as it was
