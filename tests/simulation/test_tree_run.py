"""Runs with tree aggregation: both engines, resume, the budget stop, the summary and the CLI."""

import json
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import rdp

from fedprivopt.cli import main
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.files import CHECKPOINT, read_rows
from fedprivopt.simulation.run import resume, simulate

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
TREE = {
    "population": 12,
    "clients-per-round": 3,
    "task-params.num-users": 12,
    "num-server-rounds": 7,
    "noise-mechanism": "tree",
    "tree-restart-rounds": 3,
    "noise-multiplier": 1.0,
}


def tree_config(**extra):
    return load_config(PRESET, {**TREE, **extra})


def dp_accounting_epsilon(sigma, steps, periods, delta):
    acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(
        dpa.SelfComposedDpEvent(dpa.SingleEpochTreeAggregationDpEvent(sigma, steps), periods)
    )
    return acc.get_epsilon(delta)


def test_a_tree_run_accounts_its_periods_and_names_the_mechanism(tmp_path):
    outcome = simulate(tree_config(), tmp_path / "run")
    want = dp_accounting_epsilon(1.0, 3, 3, 1e-4)  # rounds 1-3, 4-6, 7(-9)
    assert outcome.epsilon == pytest.approx(want, rel=1e-12)
    summary = json.loads((outcome.out_dir / "summary.json").read_text())
    assert summary["noise_mechanism"] == "tree" and summary["tree_restart_rounds"] == 3
    assert "each user at most once per restart period" in summary["threat_model"]
    rows = read_rows(outcome.out_dir / "metrics.jsonl")
    assert [r["cohort_size"] for r in rows] == [3.0] * 7
    assert [r["tree_nodes"] for r in rows] == [1, 2, 1, 1, 2, 1, 1]
    assert [r["epsilon"] for r in rows][:4] == [rows[0]["epsilon"]] * 3 + [rows[3]["epsilon"]]
    ledger = (outcome.out_dir / "privacy_ledger.jsonl").read_text().splitlines()[1:]
    charged = [json.loads(line)["released"] != [] for line in ledger]
    assert charged == [True, False, False, True, False, False, True]


def test_the_budget_stops_before_a_period_that_would_exceed_it(tmp_path):
    one, two = (dp_accounting_epsilon(1.0, 3, p, 1e-4) for p in (1, 2))
    target = (one + two) / 2
    outcome = simulate(tree_config(**{"target-epsilon": target}), tmp_path / "b")
    assert outcome.stopped_reason == "budget" and outcome.rounds_completed == 3
    assert outcome.epsilon == pytest.approx(one, rel=1e-12) and outcome.epsilon <= target


def test_resume_mid_period_gives_bit_identical_params(tmp_path):
    """Stopped at round 4 (one round into the second tree), extended to 7 and resumed."""
    full = simulate(tree_config(strategy="dp-fedadam", **{"server-learning-rate": 0.05}),
                    tmp_path / "full")  # fmt: skip
    part = simulate(
        tree_config(strategy="dp-fedadam", **{"server-learning-rate": 0.05,
                                              "num-server-rounds": 4}),
        tmp_path / "part",
    )  # fmt: skip
    cfg = part.out_dir / "config.toml"
    cfg.write_text(cfg.read_text().replace("num-server-rounds = 4", "num-server-rounds = 7"))
    outcome = resume(part.out_dir)
    assert outcome.rounds_completed == 7
    assert torch.equal(outcome.params, full.params)
    assert outcome.epsilon == full.epsilon


@pytest.mark.parametrize("strategy", ["dp-fedadam", "adadps"])
def test_fast_and_flower_engines_end_with_the_same_model(tmp_path, strategy):
    extra = {"strategy": strategy, "num-server-rounds": 4, "server-learning-rate": 0.1,
             "ray-cpus": 2}  # fmt: skip
    fast = simulate(tree_config(**extra, engine="fast"), tmp_path / "fast")
    flower = simulate(tree_config(**extra, engine="flower"), tmp_path / "flower")
    torch.testing.assert_close(flower.params, fast.params, rtol=0, atol=1e-6)
    assert flower.epsilon == fast.epsilon
    assert [r["cohort_size"] for r in flower.rows] == [3.0] * 4


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["tree-restart-rounds=5"], "tree-restart-rounds must be in [0, population // "),
        (["noise-mode=distributed"], "noise-mode must be 'server' with noise-mechanism 'tree'"),
        (["accountant=prv"], "accountant must be 'rdp' with noise-mechanism 'tree'"),
        (["noise-mechanism=trees"], "noise-mechanism must be one of gaussian, tree"),
    ],
)
def test_bad_tree_settings_exit_2_in_one_line(tmp_path, capsys, sets, needle):
    out = tmp_path / "never"
    settings = {**TREE, "noise-mechanism": "tree"} | dict(s.split("=", 1) for s in sets)
    argv = [f"--set={k}={v}" for k, v in settings.items()]
    try:
        code = main(["simulate", str(PRESET), "--out", str(out), "--quiet", *argv])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_redone_first_round_of_a_period_is_replayed_not_charged_twice(tmp_path):
    """The newest checkpoint (round 5, the first of period 2) lost: resumed from round 4.

    Round 5 is redone from the previous checkpoint; it releases the same model (same digest),
    so its period's event, in the ledger already, is not charged again.
    """
    extra = {"tree-restart-rounds": 4, "checkpoint-every": 2}
    full = simulate(tree_config(**extra), tmp_path / "full")
    part = simulate(tree_config(**extra, **{"num-server-rounds": 5}), tmp_path / "part")
    (part.out_dir / CHECKPOINT).write_bytes(b"torn write")
    cfg = part.out_dir / "config.toml"
    cfg.write_text(cfg.read_text().replace("num-server-rounds = 5", "num-server-rounds = 7"))
    outcome = resume(part.out_dir)
    assert outcome.rounds_completed == 7
    assert torch.equal(outcome.params, full.params)
    assert outcome.epsilon == full.epsilon == pytest.approx(dp_accounting_epsilon(1.0, 4, 2, 1e-4))


@pytest.mark.parametrize("secure", [True, False])
def test_an_interrupted_secure_tree_run_is_not_told_to_resume(tmp_path, secure):
    """Review of issue 20, finding 7: an interrupted secure tree run was told it could continue
    with --resume, which then refused (rounds released after the newest checkpoint)."""
    from fedprivopt.cli import _interrupted
    from fedprivopt.simulation.interrupt import Interrupted

    extra = {"checkpoint-every": 2, "num-server-rounds": 4, "secure": secure}
    out = simulate(tree_config(**extra), tmp_path / "run").out_dir
    (out / CHECKPOINT).unlink()  # as if interrupted after round 4: the newest is round 2's
    line = _interrupted("simulate", Interrupted(2, out))
    if secure:
        assert "cannot be resumed (noise-mechanism = tree with secure = true: rounds 3-4" in line
        assert "--resume" not in line
    else:
        assert line.endswith(f"--resume {out}")
