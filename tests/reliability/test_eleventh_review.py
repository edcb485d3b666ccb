"""Issue 15, eleventh hostile review (findings 1, 2, 4, 5, 6): each case failed before its fix.

Finding 1: a clip norm whose noise std overflowed mid-run (the adaptive ``C`` grew until
``sum_noise_std**2`` raised ``OverflowError``; ``σ C`` itself and ``σ_Δ C`` were not checked, only
``(σC/m̄)²``). Finding 2: a grid key spelled as a strategy table escaped the checks against
``--set`` and compare's noise-multiplier axis, so trials ran other values than their labels.
Finding 4: ``--set strategies.S.seed`` (or ``.noise-multiplier``) replaced every compare cell's
and every tuning trial's own value. Finding 5: a grid key of another strategy's table set nothing,
and its trials were labelled by it. Finding 6: ``compare-tuned --out`` replaced a user's own
``report.md`` or ``summary.csv`` (the report's file names made the directory "ours").
Finding 3 (fixed after the review): ``clip-quantile``, ``clip-learning-rate`` and
``clip-count-stddev`` were silently ignored without adaptive clipping; a value other than the
key's default is now refused naming it and ``adaptive-clipping``.

Run against the code before the fixes (``git stash`` of the changed modules, 2026-11-25): every
test failed there (``OverflowError`` tracebacks with rc 1, no ``ValueError`` from the config,
rc 0 where one line with rc 2 is expected, a user's file replaced) except four that passed
before and after: the sixth review's ``clients-per-round=1e-200`` case and three controls (another
strategy's table still applies, in tune and in compare; compare-tuned replaces its own report).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from fedprivopt.strategies.clipping import AdaptiveClipping
from fedprivopt.strategies.config import MAX_SUM_NOISE_STD, StrategyConfig
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import SMALL, TOY, usage_error

# -- finding 1: the noise std of a round's sum stays a float -----------------------------------


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"noise-multiplier": 1.0, "clip-norm": 5e154}, "clip-norm"),  # (σC/m̄)² was finite
        ({"noise-multiplier": 1.0, "clip-norm": 1e152, "noise-mode": "distributed"}, "clip-norm"),
        (  # σ_Δ ≈ 1.8e4 σ: the sum's multiplier, not σ, sizes the noise
            {"adaptive-clipping": True, "clip-count-stddev": 0.2500000001, "clip-norm": 1e152},
            "clip-norm",
        ),
        (
            {"strategy": "dp2", "noise-multiplier": 1.0, "clip-norm-adaptive": 5e154},
            "clip-norm-adaptive",
        ),
        ({"clients-per-round": 1e-200}, "clip-norm"),  # the sixth review's case still holds
    ],
)
def test_a_clip_norm_whose_noise_overflows_is_refused(settings, key):
    base = {"population": 40, "clients-per-round": 10.0, "noise-multiplier": 0.5}
    said = f"lower {key} or raise clients-per-round"
    if "clients-per-round" in settings:  # forty-fifth review (input 6): no clip-norm fits 1e-200
        said = r"raise clients-per-round \(to at least"
    with pytest.raises(ValueError, match=said):
        StrategyConfig.from_mapping({**base, **settings})


def test_the_largest_accepted_clip_norm_noises_without_overflow():
    config = StrategyConfig(population=40, clients_per_round=10.0, noise_multiplier=1.0)
    limit = config.max_clip_norm
    assert limit == MAX_SUM_NOISE_STD
    StrategyConfig(population=40, clients_per_round=10.0, noise_multiplier=1.0, clip_norm=limit)
    # the aggregator's variances: the sum's, times up to the population (distributed shares)
    assert math.isfinite((limit * 1.0) ** 2 * 10**8)
    assert StrategyConfig(strategy="fedavg", clip_norm=1e300).max_clip_norm == sys.float_info.max


def test_the_adaptive_clip_norm_stops_where_its_noise_would_overflow():
    config = StrategyConfig(
        population=40, clients_per_round=10.0, noise_multiplier=0.5, adaptive_clipping=True,
        clip_quantile=0.9999, clip_learning_rate=1000.0,
    )  # fmt: skip
    clipping = AdaptiveClipping(config, None)
    clipping.clip_norm(None)
    for _ in range(5):  # every user clipped: C grows by e^999.9 a round (capped at e^700)
        clipping._fractions.append(0.0)
        metrics = clipping.step()
        assert metrics["next_clip_norm"] <= config.max_clip_norm
    assert clipping.clip_norm(None) == config.max_clip_norm
    assert math.isfinite((config.update_noise_multiplier * clipping.clip_norm(None)) ** 2)
    with pytest.raises(ValueError, match="adaptive clip norm"):
        clipping.load_state_dict({"clip-norm": {"clip_norm": config.max_clip_norm * 4}})


def test_an_adaptive_run_whose_clip_norm_explodes_finishes(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "4", "--out", str(out), *SMALL,
            "--set", "adaptive-clipping=true", "--set", "clip-quantile=0.9999",
            "--set", "clip-learning-rate=1000", "--set", "clip-count-stddev=1"]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    limit = StrategyConfig(
        population=12, clients_per_round=4.0, noise_multiplier=0.5, adaptive_clipping=True,
        clip_count_stddev=1.0,
    ).max_clip_norm  # fmt: skip
    assert all(row["clip_norm"] <= limit for row in rows)


@pytest.mark.parametrize(
    "settings",
    [
        ["--set", "noise-multiplier=1", "--set", "clip-norm=5e154"],
        [
            "--set",
            "noise-multiplier=1",
            "--set",
            "clip-norm=5e154",
            "--set",
            "noise-mechanism=tree",
        ],
    ],
)
def test_simulate_refuses_the_clip_norm_in_one_line(tmp_path, settings):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), *SMALL, *settings]
    usage_error(run_cli(argv), "clip-norm", "1e+150")
    assert not out.exists()


# -- finding 2: a grid key in any spelling meets the checks of its bare key --------------------


def _tune(out: Path, *extra: str) -> list[str]:
    return ["tune", str(TOY), "--rounds", "1", "--mean-trials", "1", "--seed", "3",
            "--out", str(out), *SMALL, *extra]  # fmt: skip


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--set", "strategies.dp-fedavg.server-learning-rate=1",
          "--grid", "server-learning-rate=0.1,0.3"],
         ["server-learning-rate", "strategies.dp-fedavg.server-learning-rate"]),
        (["--set", "noise-multiplier=0.5", "--grid", "strategies.dp-fedavg.noise-multiplier=1,2"],
         ["strategies.dp-fedavg.noise-multiplier", "'noise-multiplier'"]),
        (["--grid", "strategies.dp-fedavg={num-server-rounds=3}"], ["num-server-rounds"]),
    ],
)  # fmt: skip
def test_tune_refuses_a_grid_key_that_set_sets_in_another_spelling(tmp_path, extra, needles):
    out = tmp_path / "t"
    usage_error(run_cli(_tune(out, *extra)), "argument --grid", *needles)
    assert not out.exists()


def test_another_strategys_table_is_not_the_tuned_key(tmp_path):
    out = tmp_path / "t"
    code, _, err = run_cli(_tune(out, "--set", "strategies.dp-fedadam.server-learning-rate=1",
                                 "--grid", "server-learning-rate=0.1,0.3"))  # fmt: skip
    assert code == 0, err[-2000:]
    (trial,) = (out / "runs").iterdir()
    hyper = json.loads((out / "tune.json").read_text())["trials"][0]["hyperparameters"]
    assert f"server-learning-rate = {float(hyper['server-learning-rate'])}" in (
        (trial / "config.toml").read_text()
    )


@pytest.mark.parametrize(
    "grid",
    ["strategies.dp-fedavg.noise-multiplier=1,2", "strategies={dp-fedavg={noise-multiplier=2}}",
     "strategies.dp-fedavg={noise-multiplier=2}"],
)  # fmt: skip
def test_compare_refuses_the_noise_axis_as_a_strategy_table(tmp_path, grid):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--noise-multipliers", "0.5",
            "--tune-grid", grid, "--mean-trials", "1", "--rounds", "1", "--out", str(out),
            *SMALL]  # fmt: skip
    usage_error(run_cli(argv), "argument --tune-grid", "noise-multiplier is the comparison's axis")
    assert not out.exists()


# -- finding 4: a strategy table in --set does not replace a cell's or a trial's own value -----


@pytest.mark.parametrize(
    "extra, key",
    [
        (["--seeds", "2", "--set", "strategies.dp-fedavg.seed=7"], "seed"),
        (["--noise-multipliers", "0.5,1", "--set", "strategies.dp-fedavg.noise-multiplier=50"],
         "noise-multiplier"),
        (["--set", "strategies={dp-fedavg={noise-multiplier=50}}"], "noise-multiplier"),
        (["--tune-grid", "server-learning-rate=0.3,1", "--mean-trials", "1",
          "--set", "strategies.dp-fedavg.seed=7"], "seed"),
    ],
)  # fmt: skip
def test_compare_refuses_a_strategy_table_over_the_cells_own_keys(tmp_path, extra, key):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--out", str(out),
            *SMALL, *extra]  # fmt: skip
    usage_error(run_cli(argv), "argument --set", f"sets {key} for a strategy")
    assert not out.exists()


def test_tune_refuses_a_strategy_table_over_the_trials_seeds(tmp_path):
    out = tmp_path / "t"
    argv = _tune(out, "--grid", "server-learning-rate=0.3,1",
                 "--set", "strategies.dp-fedavg.seed=7")  # fmt: skip
    usage_error(run_cli(argv), "argument --set", "every trial runs its own seed")
    assert not out.exists()


def test_another_strategys_table_still_applies_in_compare(tmp_path):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg,dp-fedadam", "--rounds", "1",
            "--out", str(out), *SMALL,
            "--set", "strategies.dp-fedadam.server-learning-rate=0.05"]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err[-2000:]
    fedadam = next((out / "runs").glob("dp-fedadam__*")) / "config.toml"
    assert "server-learning-rate = 0.05" in fedadam.read_text()


# -- finding 5: a grid key that sets nothing for the tuned strategy ----------------------------


def test_tune_refuses_a_grid_key_of_another_strategys_table(tmp_path):
    out = tmp_path / "t"
    argv = _tune(out, "--grid", "strategies.dp-fedadam.noise-multiplier=1,2")
    usage_error(run_cli(argv), "argument --grid", "sets nothing for dp-fedavg")
    assert not out.exists()


# -- finding 6: compare-tuned replaces only its own earlier report -----------------------------


@pytest.fixture(scope="module")
def tuning(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tuning") / "t"
    code, _, err = run_cli(_tune(out, "--grid", "server-learning-rate=0.3,1"))
    assert code == 0, err[-2000:]
    return out


@pytest.mark.parametrize("name", ["report.md", "summary.csv"])
def test_compare_tuned_keeps_a_users_file_of_a_report_name(tmp_path, tuning, name):
    out = tmp_path / "rep"
    out.mkdir()
    (out / name).write_text("mine\n")
    argv = ["compare-tuned", str(tuning), "--out", str(out)]
    usage_error(run_cli(argv), "argument --out", f"holds '{name}', which compare-tuned did not")
    assert (out / name).read_text() == "mine\n"
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_compare_tuned_replaces_its_own_report(tmp_path, tuning):
    out = tmp_path / "rep"
    argv = ["compare-tuned", str(tuning), "--out", str(out)]
    for _ in range(2):
        code, _, err = run_cli(argv)
        assert code == 0, err[-2000:]
    assert (out / "report.md").read_text().startswith("# fedprivopt compare-tuned\n")


# -- finding 3: an adaptive-clipping key without adaptive clipping -----------------------------

ADAPTIVE_KEYS = {"clip-quantile": 0.9, "clip-learning-rate": 0.5, "clip-count-stddev": 0.3}


@pytest.mark.parametrize("strategy", ["dp-fedavg", "fedavg"])
@pytest.mark.parametrize("key", sorted(ADAPTIVE_KEYS))
def test_an_adaptive_key_without_adaptive_clipping_is_refused(strategy, key):
    with pytest.raises(ValueError, match=f"{key} applies only with adaptive-clipping = true"):
        StrategyConfig.from_mapping({"strategy": strategy, key: ADAPTIVE_KEYS[key]})
    with pytest.raises(ValueError, match=key):  # explicitly off alike
        StrategyConfig.from_mapping({key: ADAPTIVE_KEYS[key], "adaptive-clipping": False})


def test_adaptive_keys_at_their_defaults_or_with_adaptive_clipping_are_accepted():
    StrategyConfig.from_mapping({"clip-quantile": 0.5, "clip-learning-rate": 0.2})
    config = StrategyConfig.from_mapping(
        {"adaptive-clipping": True, **ADAPTIVE_KEYS, "clip-count-stddev": 1.0}
    )
    assert (config.clip_quantile, config.clip_learning_rate) == (0.9, 0.5)
    # a non-private baseline ignores adaptive clipping itself, so a shared preset still runs
    StrategyConfig.from_mapping({"strategy": "fedavg", "adaptive-clipping": True, **ADAPTIVE_KEYS})


@pytest.mark.parametrize(
    "extra",
    [["--set", "clip-count-stddev=0.3"], ["--set", "clip-learning-rate=1"]],
)
def test_simulate_refuses_an_adaptive_key_in_one_line(tmp_path, extra):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), *SMALL, *extra]
    key = extra[1].split("=")[0]
    usage_error(run_cli(argv), key, "adaptive-clipping = true")
    assert not out.exists()


def test_tune_refuses_a_grid_of_an_adaptive_key_without_adaptive_clipping(tmp_path):
    out = tmp_path / "t"
    argv = _tune(out, "--grid", "clip-count-stddev=0.3,1")
    usage_error(run_cli(argv), "grid point", "clip-count-stddev applies only with adaptive")
    assert not out.exists()


def test_a_stored_config_with_the_defaults_still_resumes(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "2", "--out", str(out), *SMALL]
    code, _, err = run_cli(argv)
    assert code == 0, err[-2000:]
    path = out / "config.toml"
    text = path.read_text()
    path.write_text("clip-quantile = 0.5\nclip-learning-rate = 0.2\n" + text)
    code, _, err = run_cli(["simulate", "--resume", str(out), "--quiet"])
    assert code == 0, err[-2000:]
    path.write_text("clip-quantile = 0.7\n" + text)  # an edit that would have been ignored
    usage_error(run_cli(["simulate", "--resume", str(out), "--quiet"]), "clip-quantile")
