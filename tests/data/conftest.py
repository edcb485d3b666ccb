"""Fixtures for the data tests (helpers live in ``so_fixtures``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from so_fixtures import write_tff_sqlite


@pytest.fixture
def tff_sqlite(tmp_path) -> Path:
    """An unindexed ``stackoverflow.sqlite`` in the real schema (like the TFF download)."""
    return write_tff_sqlite(tmp_path / "stackoverflow.sqlite")


@pytest.fixture
def tff_sqlite_indexed(tmp_path) -> Path:
    return write_tff_sqlite(tmp_path / "stackoverflow.sqlite", index=True)


@pytest.fixture(scope="session")
def tiny_synthetic(tmp_path_factory):
    """The tiny synthetic dataset, generated once per session."""
    from fedprivopt.data.synthetic import generate
    from fedprivopt.data.synthetic_config import SyntheticConfig

    return generate(tmp_path_factory.mktemp("synthetic"), SyntheticConfig.tiny())
