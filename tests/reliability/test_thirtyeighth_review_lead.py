"""Issue 15, thirty-eighth review: the lead's findings.

1. ``simulate toy.toml --engine flower --rounds 1 --quiet`` ended rc 0 with its one result
   line, and then six lines on stderr no user can act on: Flower's ``DEPRECATED FEATURE: The
   `run_simulation` function is deprecated …`` (the engine's own call; it named ``flwr run`` as
   the remedy) and Ray's ``FutureWarning: Tip: In future versions of Ray, Ray will no longer
   override accelerator visible devices env var if num_gpus=0 …`` (the engine asks for no GPU
   on purpose). ``core.logs.hide_engine_notices`` (called by ``log_warnings_to_stderr``, which
   every command and worker calls first) drops exactly these two; Flower's other warnings and
   other ``FutureWarning`` s still print.
"""

from __future__ import annotations

import logging
import warnings

from fedprivopt.core.logs import (
    RAY_ACCELERATOR_TIP,
    RUN_SIMULATION_DEPRECATED,
    hide_engine_notices,
    log_warnings_to_stderr,
)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_1_flowers_notice_of_the_engines_own_call_is_dropped_and_no_other():
    from flwr.supercore.logger import warn_deprecated_feature

    records = _Records()
    flower = logging.getLogger("flwr")
    flower.addHandler(records)
    try:
        log_warnings_to_stderr()
        hide_engine_notices()  # twice: one filter, not two
        warn_deprecated_feature(RUN_SIMULATION_DEPRECATED + " and will be removed …")
        warn_deprecated_feature("something a user of Flower calls")
    finally:
        flower.removeHandler(records)
    assert len(records.lines) == 1, records.lines  # before: 2 (the engine's notice printed)
    assert "something a user of Flower calls" in records.lines[0]
    assert sum(type(f).__name__ == "_EngineNotices" for f in flower.filters) == 1


def test_1_rays_accelerator_tip_is_ignored_and_no_other_future_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hide_engine_notices()
        tip = RAY_ACCELERATOR_TIP + " visible devices env var if num_gpus=0"
        warnings.warn(tip, FutureWarning, stacklevel=1)
        warnings.warn("another future change", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another future change"]
