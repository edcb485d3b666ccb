"""Issue 15, forty-sixth hostile review (input: bad input and the data readers): tests.

1. ``simulate https://example.org/toy.toml`` (a preset's address pasted where its path
   belongs; also ``s3://b/x.toml``, ``compare``, ``tune``, ``deploy local`` and the Python
   ``load_config``, with a ``str`` or a ``Path``). Before: ``config file
   'https:/example.org/toy.toml' does not exist``, a path not typed, and where
   ``./https:/example.org/toy.toml`` existed that local file was read and run (rc 0), where
   ``--out``, ``--resume`` and the data directories refuse a URL. Now
   ``simulation.config.load_config`` refuses it as they do (``core.files.url_refusal``):
   ``config file 'https://example.org/toy.toml' is a URL (https://), not a path: ...``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedprivopt.simulation.config import load_config

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def test_1_a_preset_named_by_a_url_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"'s3:/b/x.toml' is a URL \(s3://\)"):
        load_config(Path("s3://b/x.toml"))  # Path writes s3:/b/x.toml, no such directory here
    local = tmp_path / "https:" / "example.org"
    local.mkdir(parents=True)
    shutil.copy(TOY, local / "toy.toml")  # what the text would name as a relative path
    with pytest.raises(ValueError, match=r"is a URL \(https://\), not a path"):
        load_config("https://example.org/toy.toml")
    # the local directory named as a path is read
    assert load_config(Path("https:") / "example.org" / "toy.toml").task_params["num_users"] == 40
