"""AdaDPS' side information in a run: configuration, public-user exclusion, ε, summary, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flwr.common.config import fuse_dicts

from fedprivopt.cli import main
from fedprivopt.deploy.local import REPO_ROOT
from fedprivopt.deploy.runconfig import (
    app_config_defaults,
    run_config_from_flower,
    to_flower_overrides,
)
from fedprivopt.models.side_information_config import SideInformationSpec
from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.calibration import make_round_event
from fedprivopt.simulation.checkpoint import load_checkpoint
from fedprivopt.simulation.config import config_to_toml, load_config
from fedprivopt.simulation.config_presets import parse_override
from fedprivopt.simulation.run import build_run, resume, simulate
from fedprivopt.strategies.core import drive_round

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
PUBLIC = {
    "strategy": "adadps",
    "population": 40,
    "clients-per-round": 10,
    "task-params.num-users": 40,
    "side-information.kind": "public-users",
    "side-information.users": 4,
}


def config(**extra):
    base = dict(PUBLIC)
    if "side-information.kind" in extra:  # another kind: not public-users' parameters
        base.pop("side-information.users")
    return load_config(PRESET, {**base, **extra})


# -- configuration -----------------------------------------------------------------------------


def test_table_in_a_preset_and_its_round_trip(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text(
        PRESET.read_text() + '\n[side-information]\nkind = "two-level"\ntop-k = 50\nfactor = 100\n'
    )
    cfg = load_config(preset)
    assert cfg.side_information == SideInformationSpec("two-level", {"top-k": 50, "factor": 100.0})
    assert "[side-information]" in config_to_toml(cfg)
    (tmp_path / "c.toml").write_text(config_to_toml(cfg))
    assert load_config(tmp_path / "c.toml") == cfg
    # --set of the same kind keeps the table's other keys; another kind replaces the table
    same = load_config(preset, dict([parse_override("side-information.top-k=10")]))
    assert same.side_information.params == {"top-k": 10, "factor": 100.0}
    other = load_config(preset, dict([parse_override("side-information.kind=public-users")]))
    assert other.side_information == SideInformationSpec("public-users")
    assert load_config(preset, {"side-information": "ones"}).side_information.kind == "ones"
    with pytest.raises(ValueError, match=r"unknown key 'side-information\.power'"):
        load_config(preset, {"side-information.power": 0.5})


def test_string_form_strategy_table_and_set(tmp_path):
    assert load_config(PRESET).side_information == SideInformationSpec("auto")
    old = tmp_path / "old.toml"
    old.write_text('side-information = "ones"\n' + PRESET.read_text())
    assert load_config(old).side_information == SideInformationSpec("ones")
    sets = dict(
        parse_override(text)
        for text in ("side-information.kind=token-frequency", "side-information.power=0.5")
    )
    cfg = load_config(old, sets)
    assert cfg.side_information == SideInformationSpec("token-frequency", {"power": 0.5})
    table = tmp_path / "table.toml"
    table.write_text(
        PRESET.read_text()
        + '\n[strategies.adadps.side-information]\nkind = "public-users"\nusers = 2\n'
    )
    assert load_config(table).side_information.kind == "auto"  # another strategy runs
    adadps = load_config(table, {"strategy": "adadps"})
    assert adadps.side_information == SideInformationSpec("public-users", {"users": 2})


def test_flattened_flower_run_config_and_overrides():
    defaults = app_config_defaults(REPO_ROOT)
    cfg, _ = run_config_from_flower(defaults)
    assert cfg.side_information == SideInformationSpec("auto")
    flat = {**defaults, "side-information.kind": "two-level", "side-information.top-k": 7}
    cfg, _ = run_config_from_flower(flat)
    assert cfg.side_information == SideInformationSpec("two-level", {"top-k": 7})
    with pytest.raises(ValueError, match=r"side-information\.factor must be"):
        run_config_from_flower({**flat, "side-information.factor": -2.0})
    wanted = config(**{"side-information.eps": 1e-3})
    overrides = to_flower_overrides(wanted, app_keys=defaults)
    assert overrides["side-information.kind"] == "public-users"
    assert overrides["side-information.top-k"] == ""  # declared keys of other kinds: unset
    back, _ = run_config_from_flower(fuse_dicts(defaults, overrides))
    assert back.side_information == wanted.side_information
    assert back.strategy == wanted.strategy


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["side-information.kind=two-level"], "side-information.kind = 'two-level' needs a bag"),
        (["side-information.kind=public-users", "side-information.users=31"], "users must be"),
        (["side-information.kind=two-level", "side-information.top-k=0"], "top-k must be"),
        (["side-information.kind=ones", "side-information.eps=1"], "side-information.eps"),
        (["side-information.kind=magic"], "side-information.kind must be one of"),
    ],
)
def test_bad_side_information_exits_2_naming_the_key(tmp_path, capsys, argv, needle):
    out = tmp_path / "never"
    sets = [arg for text in ["strategy=adadps", *argv] for arg in ("--set", text)]
    code = main(["simulate", str(PRESET), "--out", str(out), "--quiet", *sets])
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


# -- public users --------------------------------------------------------------------------------


def test_public_users_are_never_sampled_and_the_population_is_private():
    task, alg = build_run(config())
    assert task.num_users == 40 and alg.user_offset == 4
    assert alg.config.population == 36 and alg.config.sample_rate == pytest.approx(10 / 36)
    assert alg.user_ids == range(4, 40)
    seen = set()
    for r in range(1, 401):
        seen.update(alg.sample(r))
    assert min(seen) == 4 and max(seen) == 39 and seen == set(range(4, 40))
    _, plain = build_run(config(**{"side-information.kind": "ones"}))
    assert plain.user_offset == 0 and plain.config.population == 40
    assert min(u for r in range(1, 50) for u in plain.sample(r)) < 4  # the check can fail


def test_public_users_are_never_trained_and_epsilon_is_that_of_the_private_population(capsys):
    cfg = config(**{"num-server-rounds": 15})
    _, alg = build_run(cfg)
    requested: list[int] = []

    def train(request):
        requested.extend(request.users)
        assert torch.equal(request.preconditioner, alg.side_information)
        return {u: torch.zeros_like(request.params) for u in request.users}

    for r in range(1, 16):
        drive_round(alg, r, train)
    assert requested and min(requested) >= 4
    s = cfg.strategy
    q = 10 / 36
    event = make_round_event(s.noise_multiplier, sampling="poisson", sample_rate=q)
    expected = compose_epsilon([(event, 15)], s.delta, accountant=s.accountant)
    assert alg.epsilon() == pytest.approx(expected, rel=1e-12)
    argv = ["epsilon", "--sample-rate", repr(q), "--noise-multiplier", "0.5", "--rounds", "15"]
    assert main([*argv, "--delta", repr(s.delta), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] == pytest.approx(alg.epsilon())
    wrong = make_round_event(s.noise_multiplier, sampling="poisson", sample_rate=10 / 40)
    assert alg.epsilon() > compose_epsilon([(wrong, 15)], s.delta) * 1.01


def test_fixed_size_sampling_is_accounted_over_the_private_population():
    _, alg = build_run(config(sampling="fixed"))
    assert alg.round_event() == make_round_event(
        0.5, sampling="fixed", population=36, cohort_size=10
    )
    assert all(min(alg.sample(r)) >= 4 and len(alg.sample(r)) == 10 for r in range(1, 100))


def test_summary_and_threat_model_name_the_public_users(tmp_path):
    outcome = simulate(config(**{"num-server-rounds": 2}), tmp_path / "run")
    summary = json.loads((outcome.out_dir / "summary.json").read_text())
    side = summary["side_information"]
    assert side["kind"] == "public-users" and side["requested"] == "public-users"
    assert side["parameters"] == {"users": 4, "eps": 1e-5, "max-ratio": 200.0}
    assert side["public_users"] == [0, 1, 2, 3] and side["private_population"] == 36
    assert side["covered_by_guarantee"] is False
    for text in (side["exclusion"], summary["threat_model"]):
        assert "excluded from the sampled and accounted population (36 private users)" in text
        assert "never trained on privately" in text and "users 0..3" in text
    assert summary["config"]["population"] == 40
    # the default was chosen on the tag task: on the toy task it is ones (and the summary says so)
    auto = simulate(
        config(**{"side-information.kind": "auto", "num-server-rounds": 1}), tmp_path / "a"
    )
    summary = json.loads((auto.out_dir / "summary.json").read_text())
    assert summary["side_information"]["kind"] == "ones" and "note" in summary["side_information"]
    assert "private users" not in summary["threat_model"]
    other = simulate(config(strategy="dp-fedavg", **{"num-server-rounds": 1}), tmp_path / "f")
    summary = json.loads((other.out_dir / "summary.json").read_text())
    assert summary["side_information"] is None and "side information" not in summary["threat_model"]


def test_resume_keeps_the_public_users_and_refuses_another_side_information(tmp_path):
    full = simulate(config(**{"num-server-rounds": 4}), tmp_path / "full")
    part = simulate(config(**{"num-server-rounds": 2}), tmp_path / "part")
    state = load_checkpoint(part.out_dir)["algorithm"]
    assert state["user_offset"] == 4 and len(state["side_information"]) == 64
    path = part.out_dir / "config.toml"
    path.write_text(path.read_text().replace("num-server-rounds = 2", "num-server-rounds = 4"))
    resumed = resume(part.out_dir)
    assert torch.equal(resumed.params, full.params) and resumed.epsilon == full.epsilon
    # another number of public users, or other side information, is not the same run
    changes = (
        ("k", "\nusers = 5\n", "different configuration"),  # the private population differs
        ("eps", "\nusers = 4\neps = 0.01\n", "different side information"),
    )
    for name, new, needle in changes:
        run = simulate(config(**{"num-server-rounds": 1}), tmp_path / name)
        path = run.out_dir / "config.toml"
        text = path.read_text().replace("num-server-rounds = 1", "num-server-rounds = 2")
        assert "\nusers = 4\n" in text
        path.write_text(text.replace("\nusers = 4\n", new))
        with pytest.raises(ValueError, match=needle):
            resume(run.out_dir)


def test_fast_and_flower_engines_agree_with_public_users(tmp_path):
    extra = {"num-server-rounds": 2, "ray-cpus": 2, "population": 12, "task-params.num-users": 12}
    extra |= {"clients-per-round": 4, "side-information.users": 2}
    fast = simulate(config(**extra, engine="fast"), tmp_path / "fast")
    flower = simulate(config(**extra, engine="flower"), tmp_path / "flower")
    torch.testing.assert_close(flower.params, fast.params, rtol=0, atol=1e-6)
    assert flower.epsilon == fast.epsilon
    assert [r["cohort_size"] for r in flower.rows] == [r["cohort_size"] for r in fast.rows]
    assert sum(r["accepted"] for r in flower.rows) == sum(r["cohort_size"] for r in flower.rows)
