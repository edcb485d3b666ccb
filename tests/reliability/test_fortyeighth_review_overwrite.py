"""Issue 15, forty-eighth hostile review (overwrite: what ``--out`` and overwrite may replace).

1. The Python API's ``simulate(config, out, overwrite=True)`` (``NewRunDir(out,
   overwrite=True)``, a tuning's discarded trial alike) over another tool's run directory: its
   own ``config.toml`` (``title = "my site"``), ``metrics.jsonl`` and ``checkpoint.pt``.
   Before: file names alone made it a run of ours, so all three were removed and a run written
   there (rc 0). Now ``rundir._check_recognisable`` refuses, naming the files, unless the
   directory's ledger or its ``config.toml`` is one fedprivopt reads; runs of ours (a finished
   one, a start killed after ``config.toml``) are replaced as before.
2. ``data synth --out D`` (``data.generate(D, config)``, a task's synthetic generation) where
   ``D`` holds TFF's download of the real dataset: its compressed ``stackoverflow.sqlite.lzma``
   or a legacy ``stackoverflow_<split>.h5``. Before: rc 0, the synthetic
   ``stackoverflow.sqlite`` written beside it, and ``open_split(D)``, ``data info D`` and a
   task whose ``data_dir`` is ``D`` (which look for ``stackoverflow.sqlite`` first) read the
   50 synthetic users in place of the real dataset. Now ``data.synthetic._generate`` refuses
   before anything is written, naming the download.
3. The data writers' ``overwrite`` read by its truth (forty-sixth review, flags 2's class, for
   ``simulate``): ``data.generate(D, config, overwrite="False")`` (a flag read from an
   environment variable or a text file) over a synthetic dataset of 120 users replaced it by
   one of 20 (``stackoverflow.sqlite``'s digest changed), and ``write_sqlite(path, ...,
   overwrite="False")`` and ``write_hdf5(path, {}, overwrite="False")`` replaced a user's own
   file at ``path``. Now ``generate``, ``write_sqlite``, ``write_hdf5`` and
   ``decompress_lzma`` take only a bool (``core.checks.check_flag``): ``ValueError: overwrite
   must be True or False, got 'False'`` before anything is read or written.
4. An empty path through the Python API (issue 15's case 10, ``--out ""``, and the
   twenty-fifth review's finding 14 for ``simulate``): ``data.generate("", config)`` and
   ``ensure_synthetic("", config)`` wrote a synthetic dataset (four files and the marker) into
   the working directory, ``write_report("", runs, title=...)`` its ``report.md``,
   ``summary.csv`` and two plots, and ``decompress_lzma(path, cache_dir="")`` decompressed
   there. Now each refuses: ``ValueError: out_dir must be a non-empty path, got ''``
   (``cache_dir`` for the last), before anything is written.
5. The Python API's ``simulate(config, "R\n")`` (a line break pasted along) and
   ``simulate(config, " ")``. Before: rc 0, the run written into a directory named by a line
   break or a blank, where ``simulate --out`` and the deployment's ``out`` refuse both. Now
   ``run_checks.check_new_run_name`` refuses before anything is written, naming ``out_dir``.
   Its twin, ``data.generate("so\n", config)`` (or ``" "``), wrote a dataset into such a
   directory: refused alike (``data.synthetic.check_out_dir``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.data import SyntheticConfig, ensure_synthetic, generate
from fedprivopt.data.hdf5 import write_hdf5
from fedprivopt.data.sqlite_lzma import decompress_lzma
from fedprivopt.data.sqlite_schema import write_sqlite
from fedprivopt.simulation.report import write_report
from fedprivopt.simulation.rundir import NewRunDir


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_1_overwrite_refuses_another_tools_run_directory(tmp_path):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "config.toml").write_text('title = "my site"\n')
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (out / "checkpoint.pt").write_bytes(b"their weights")
    before = _files(out)
    with pytest.raises(ValueError, match="not recognisably a run of ours"):
        with NewRunDir(out, overwrite=True):
            pass
    assert _files(out) == before
    # a start of ours killed after its config.toml (no ledger yet) is still replaced
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "config.toml").write_text('strategy = "dp-fedavg"\nseed = 3\n')
    (ours / "run.lock").write_text("")
    with NewRunDir(ours, overwrite=True) as path:
        assert not (path / "config.toml").exists()


@pytest.mark.parametrize("download", ["stackoverflow.sqlite.lzma", "stackoverflow_train.h5"])
def test_2_data_synth_refuses_a_directory_holding_tffs_download(tmp_path, download):
    data = tmp_path / "so"
    data.mkdir()
    (data / download).write_bytes(b"the real dataset")
    with pytest.raises(FileExistsError, match=f"holds {download}"):
        generate(data, SyntheticConfig(num_clients=20), workers=1)
    assert sorted(p.name for p in data.iterdir()) == [download]


def test_3_data_writers_take_overwrite_only_as_a_bool(tmp_path):
    data = tmp_path / "so"
    generate(data, SyntheticConfig(num_clients=20), workers=1)
    before = _files(data)
    with pytest.raises(ValueError, match="overwrite must be True or False, got 'False'"):
        generate(data, SyntheticConfig(num_clients=30), overwrite="False", workers=1)
    assert _files(data) == before
    mine = tmp_path / "mine.sqlite"
    mine.write_bytes(b"a user's own file")
    for write in (
        lambda: write_sqlite(mine, iter(()), (), overwrite="False"),
        lambda: write_hdf5(mine, {}, overwrite="False"),
        lambda: decompress_lzma(tmp_path / "x.lzma", cache_dir=tmp_path, overwrite="no"),
    ):
        with pytest.raises(ValueError, match="overwrite must be True or False"):
            write()
        assert mine.read_bytes() == b"a user's own file"


def test_4_an_empty_path_writes_nothing_into_the_working_directory(tmp_path, monkeypatch):
    import lzma

    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate
    from fedprivopt.simulation.rundata import load_runs

    toy = Path(__file__).parents[2] / "simulations" / "toy.toml"
    simulate(load_config(toy, {"num-server-rounds": 1}), tmp_path / "runs" / "r")
    runs = load_runs(tmp_path / "runs")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "x.sqlite.lzma").write_bytes(lzma.compress(b"SQLite format 3\x00"))
    before = sorted(p.name for p in work.iterdir())
    for write in (
        lambda: generate("", SyntheticConfig(num_clients=20), workers=1),
        lambda: ensure_synthetic("", SyntheticConfig(num_clients=20)),
        lambda: write_report("", runs, title="x"),
        lambda: decompress_lzma(work / "x.sqlite.lzma", cache_dir=""),
    ):
        with pytest.raises(ValueError, match="must be a non-empty path"):
            write()
        assert sorted(p.name for p in work.iterdir()) == before


@pytest.mark.parametrize("name", ["R\n", " ", "a/ /b", "R\x1b[2J"])
def test_5_simulate_refuses_a_run_directory_named_by_control_characters(
    tmp_path, monkeypatch, name
):
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import simulate

    toy = Path(__file__).parents[2] / "simulations" / "toy.toml"
    config = load_config(toy, {"num-server-rounds": 1})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"out_dir: (the path holds a control|a path component)"):
        simulate(config, name)
    with pytest.raises(ValueError, match=r"out_dir (holds a control|has a blank)"):
        generate(name, SyntheticConfig(num_clients=20), workers=1)
    assert list(tmp_path.iterdir()) == []
