"""Issue 15, forty-sixth hostile review (contract: the privacy contract, measured): tests.

1. ``simulate toy.toml --seed 912345 --rounds 1`` (seeded, the default ``secure = false``).
   Before: ``summary.json``'s ``threat_model`` said the seed is "recorded in this summary and
   config.toml", and ``not_covered`` of a task recording no data identity (toy) said to
   publish "the models", while ``privacy_ledger.jsonl``'s header and every checkpoint hold the
   seed too (``ledger_header.settings.seed``, ``algorithm.config.seed``): from
   ``checkpoint.pt`` alone and the public preset, regenerating round 1's noise (a zero-update
   aggregate of ``alg.sample(1)`` with that seed) gave the round's exact clipped sum to 1.8e-7,
   where the release is 1.31 away, and its cohort. Now the threat model names every file that
   records the seed and says to publish the model's parameters, not the checkpoint files
   (``summary_privacy.threat_model``).
2. ``tune toy.toml --grid server-learning-rate=0.5,1 --mean-trials 1 --rounds 1``. Before: the
   released trial's own ``summary.json`` gave ``epsilon`` 7.551 (its run's) under a threat
   model of "every released model", with no word that a tuning chose it, whose release costs
   8.279 (``RepeatAndSelectDpEvent``: the tuning's ``summary.json``, ``compare-tuned``); only
   ``load_run`` noted a trial (fortieth review, reports 2). Now the threat model of a run whose
   ledger header names a tuning plan says so (``summary_privacy.tuning_trial``, through
   ``RunWriter.ledger_plan``).
3. ``compare toy.toml --strategies dp-fedavg,dp-fedadam --seeds 2 --rounds 2 --set
   adaptive-clipping=true``. Before: ``report.md`` said "adaptive-clipping: true" and nothing
   of the count each round reads from the sampled users, which ε covers (each run's threat
   model says so), where it says of AdaDPS' public users and of private evaluations what ε
   does not cover. Now a line under Privacy parameters says the count is noised and accounted
   (``report_markdown._adaptive_clipping``).
4. ``compare toy.toml --strategies adadps,dp-fedavg-adadp --rounds 1 --set
   side-information.kind=public-users --set side-information.users=4``. Before: the "report
   composed" line gave both rows' composition (ε 12.34) as what publishing the report costs,
   while users 0-3 built AdaDPS' side information without noise and are private users of the
   other row. Now the line says that for them the report has no guarantee
   (``report_markdown._public_elsewhere``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.report import write_report
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.rundata import RunData
from fedprivopt.simulation.summary_privacy import threat_model

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text("utf-8"))


def test_1_the_threat_model_names_every_file_that_records_the_seed(tmp_path: Path) -> None:
    config = load_config(TOY, {"num-server-rounds": 1, "seed": 912345})
    task = ToyClassificationTask(num_users=40, seed=0)
    simulate(config, tmp_path / "seeded", task=task)
    said = _summary(tmp_path / "seeded")["threat_model"]
    checkpoint = torch.load(tmp_path / "seeded" / "checkpoint.pt", weights_only=False)
    assert checkpoint["ledger_header"]["settings"]["seed"] == 912345  # what the text names
    assert "privacy_ledger.jsonl's header and every checkpoint" in said
    assert "publish the model's parameters, not those files" in said
    secure = load_config(TOY, {"num-server-rounds": 1, "secure": True})
    simulate(secure, tmp_path / "secure", task=task)
    assert "checkpoint" not in _summary(tmp_path / "secure")["threat_model"]


def test_2_a_trial_of_a_tuning_says_its_epsilon_is_not_the_releases(tmp_path: Path) -> None:
    config = load_config(TOY, {"num-server-rounds": 1})
    trial = simulate(config, tmp_path / "trial", tuning_plan="ab" * 32)
    assert trial.epsilon == 7.550846730098353  # its own run's, as before
    told = _summary(tmp_path / "trial")["threat_model"]
    assert told.startswith(threat_model(config)) and "; a trial of a tuning" in told
    assert "costs the tuning's epsilon" in told
    assert "tuning" not in threat_model(config)


def _run(path: Path, strategy: str, **extra) -> RunData:
    """A finished 1-round private run of ``strategy`` on the toy task's 40 users."""
    path.mkdir(parents=True)
    config = {"strategy": strategy, "noise-multiplier": 0.5, "sampling": "poisson",
              "accountant": "rdp", "delta": 1e-4, "seed": 0, "population": 40,
              "task": "toy", **extra.pop("config", {})}  # fmt: skip
    summary = {"strategy": strategy, "noise_multiplier": 0.5, "seed": 0, "epsilon": 7.55,
               "delta": 1e-4, "rounds_completed": 1, "config": config, **extra}  # fmt: skip
    rows = [{"round": r, "eval_accuracy": 0.5, "eval_loss": 0.9} for r in (0, 1)]
    return RunData(summary, rows, path, ledger_epsilon=7.55)


def _privacy_lines(tmp_path: Path, runs: list[RunData]) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = write_report(tmp_path / "report", runs, title="t").read_text("utf-8")
    return text.split("## Privacy parameters")[1].splitlines()


def test_3_a_report_says_the_adaptive_clipping_count_is_accounted(tmp_path: Path) -> None:
    adaptive = {"config": {"adaptive-clipping": True}}
    runs = [_run(tmp_path / "a", "dp-fedavg", **adaptive), _run(tmp_path / "b", "dp-fedadam")]
    lines = _privacy_lines(tmp_path, runs)
    (line,) = [x for x in lines if x.startswith("- adaptive clipping")]
    assert line.startswith("- adaptive clipping (dp-fedavg): each sampled user also reports")
    assert "the count is noised and part of every round's privacy event" in line


def test_4_report_composed_says_public_users_private_elsewhere(tmp_path: Path) -> None:
    side = {"public_users": [0, 1, 2, 3], "private_population": 36}
    runs = [_run(tmp_path / "a", "adadps", side_information=side),
            _run(tmp_path / "b", "dp-fedavg-adadp")]  # fmt: skip
    lines = _privacy_lines(tmp_path, runs)
    (line,) = [x for x in lines if x.startswith("- report composed")]
    assert "; the public users of adadps (its side information, built from their data" in line
    assert "are private users of another row, so for them the report has no guarantee" in line
    plain = [_run(tmp_path / "c", "dp-fedavg"), _run(tmp_path / "d", "dp-fedadam")]
    (line,) = [x for x in _privacy_lines(tmp_path / "p", plain) if "report composed" in x]
    assert "public users" not in line
