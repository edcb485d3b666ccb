"""Issue 15, thirty-eighth review: the lead's findings.

1. ``simulate toy.toml --engine flower --rounds 1 --quiet`` ended rc 0 with its one result
   line, and then six lines on stderr no user can act on: Flower's ``DEPRECATED FEATURE: The
   `run_simulation` function is deprecated …`` (the engine's own call; it named ``flwr run`` as
   the remedy) and Ray's ``FutureWarning: Tip: In future versions of Ray, Ray will no longer
   override accelerator visible devices env var if num_gpus=0 …`` (the engine asks for no GPU
   on purpose). ``core.logs.hide_engine_notices`` (called by ``log_warnings_to_stderr``, which
   every command and worker calls first) drops exactly these two; Flower's other warnings and
   other ``FutureWarning`` s still print.
2. (the rundirs reviewer's open row) ``simulate stackoverflow-tp-mini.toml --set
   task-params.data-dir=D --set task-params.token-cache=true --out D/.fedprivopt-cache`` (no
   ``cache-dir``): rc 0, the token store and its lock written into the run directory beside
   its ``config.toml`` (the twenty-second review's refusal covered a ``cache-dir`` given, not
   its default ``<data-dir>/.fedprivopt-cache``). ``run.check_task_dirs_outside`` checks that
   default as ``cache-dir``: rc 2, one line, before anything is written.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

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


TP_MINI = Path(__file__).resolve().parents[2] / "simulations" / "stackoverflow-tp-mini.toml"


def test_2_the_default_token_cache_inside_out_is_refused(tmp_path):
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import check_task_dirs_outside

    data = tmp_path / "D"
    config = load_config(
        TP_MINI, {"task-params.data-dir": str(data), "task-params.token-cache": True}
    )
    with pytest.raises(ValueError, match=r"task-params\.cache-dir = .*\.fedprivopt-cache.*default"):
        check_task_dirs_outside(config, data / ".fedprivopt-cache")  # before: no error
    check_task_dirs_outside(config, tmp_path / "elsewhere")
    off = load_config(TP_MINI, {"task-params.data-dir": str(data)})
    check_task_dirs_outside(off, data / ".fedprivopt-cache")  # no store without token-cache
