"""Shared pieces of the reliability (fuzz) tests: settings, input counters and a summary line.

Every property test calls :func:`count` once per generated input; the terminal summary prints
how many inputs each area tried in this session, so the numbers in reports come from a run.
``FEDPRIVOPT_FUZZ_SCALE=10`` multiplies every ``max_examples`` (a deeper, slower search).
"""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, settings

COUNTS: Counter[str] = Counter()
SCALE = float(os.environ.get("FEDPRIVOPT_FUZZ_SCALE", "1"))


def fuzz_settings(max_examples: int) -> settings:
    """Hypothesis settings of the fuzz tests: ``max_examples`` (times the scale), no deadline."""
    return settings(
        max_examples=max(1, round(max_examples * SCALE)),
        deadline=None,
        # the same inputs on every run (CI must be deterministic); FEDPRIVOPT_FUZZ_SEARCH=1
        # explores new ones (that is how an h5py hang on a damaged HDF5 file was found)
        derandomize=os.environ.get("FEDPRIVOPT_FUZZ_SEARCH", "0") != "1",
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def count(area: str) -> None:
    """Record one generated input of ``area`` (config, cli, replies, readers)."""
    COUNTS[area] += 1


def pytest_terminal_summary(terminalreporter):
    if COUNTS:
        shown = ", ".join(f"{area} {n}" for area, n in sorted(COUNTS.items()))
        terminalreporter.write_line(f"fuzz inputs tried: {shown}")
