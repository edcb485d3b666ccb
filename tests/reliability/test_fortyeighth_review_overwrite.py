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
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.data import SyntheticConfig, generate
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
