"""Issue 15, forty-second hostile review (contract: the privacy contract, end to end): tests.

1. ``summary.json``'s ``threat_model`` of a seeded run (``secure = false``, the default;
   ``simulate toy.toml``, also with ``noise-mode = distributed``). Before: "user-level DP of
   every released model ...; the server is trusted with individual clipped updates" (in
   distributed mode "each update leaves its device carrying a noise share"), while the same
   file records ``seed`` 0, from which all noise, the sampling and every client's share are
   regenerated; the server derives and sends the clients' seed, so in distributed mode it can
   remove the shares (docs/DEPLOYMENT.md, "Seeds are secrets"; DESIGN.md rule 8). Now the
   threat model of a seeded run says the guarantee holds only while the seed is secret, and in
   distributed mode that the shares protect nothing from the server unless ``secure = true``
   (``writer._threat_model``); a secure run's says neither.
2. ``summary.json``'s ``not_covered`` of a run whose task does not say whether its evaluation
   users are training users (a task of one's own without ``private_evaluation_users()``, or
   one whose method raises). Before: "..., so publish the models, epsilon and evaluations, not
   these rows", as for a task whose evaluation is drawn apart from every user, while ``tune``
   reports the same overlap as not checked. Now it says the task does not say, that this was
   not checked, and to publish the evaluations only if the task evaluates users outside the
   private population (``writer._not_covered``); a task that says ``(0, 0)`` is unchanged.
3. The rounds' wall time: ``metrics.jsonl``'s ``seconds`` and ``report.md``'s ``s/round``
   column (``compare``, ``write_report``), the one number of a comparison's Summary table
   computed from the sampled users without noise. Measured: ``simulate toy.toml --rounds 14
   --set local-epochs=30 --set vectorize=false --set eval-every=5`` gave cohorts of 8, 18 and 12
   users in 0.112, 0.309 and 0.22 s (the time follows the cohort's size and its users' example
   counts, private per rule 3). Before: ``not_covered`` named every such round metric but
   ``seconds``, and ``report.md`` published ``s/round`` with no word. Now ``not_covered`` names
   it (``writer._not_covered``) and a report with a private row says under its table that
   epsilon does not cover ``s/round`` (``report_markdown``); a report of non-private runs only is
   unchanged.
4. ``tune toy.toml --grid server-learning-rate=0.5,1 --mean-trials 1 --rounds 1`` (seeded
   trials, the tuning seed from OS entropy): its ``summary.json`` (``best.seed`` 1074242509,
   every trial's seed) and ``trials.csv`` list the run seeds, and the best trial's run is
   seeded (its noise regenerated from that seed). Before: the ``privacy`` text (summary and
   ``report.md``) named the tuning seed as the operator's secret, not the run seeds. Now it
   says the trials' run seeds of seeded runs stay with the operator too, the released trial's
   included (``tune_notes.privacy_note``).
5. ``compare toy.toml --strategies dp-fedavg --seeds 2 --rounds 1`` (seeded runs, the default;
   also ``write_report`` of such runs). Before: ``report.md`` listed the seeds (0, 1) and
   ``secure: false`` under "Privacy parameters" beside ε 7.551, with no word that each seed
   regenerates its run's noise. Now a line says how many private runs are seeded and that ε
   holds only while their seeds are secret (``report_markdown._seeded_runs``); a report of
   secure runs only has no such line.
6. ``summary.json`` of ``simulate toy.toml --rounds 2 --set sampling=fixed`` (epsilon 35.67,
   dp-accounting's replace-one bound at sigma/2; Poisson at the same settings 10.28, add/remove
   one). Before: the same ``threat_model`` text for both, "user-level DP of every released
   model", naming no neighbouring relation, which ``report.md`` names for the same runs. Now
   the threat model says neighbouring datasets differ in one user added or removed (Poisson),
   replaced (fixed-size) or under the replace-special relation (tree) (``writer._threat_model``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.report import load_run, write_report
from fedprivopt.simulation.run import simulate
from fedprivopt.simulation.tune import PrivacyPlan
from fedprivopt.simulation.tune_notes import privacy_note

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def _summary(tmp_path: Path, name: str, **overrides: object) -> dict:
    config = load_config(TOY, {"num-server-rounds": 1, **overrides})
    simulate(config, tmp_path / name)
    return json.loads((tmp_path / name / "summary.json").read_text())


@pytest.mark.parametrize("mode", ["server", "distributed"])
def test_1_seeded_threat_model_names_the_seed(tmp_path: Path, mode: str) -> None:
    seeded = _summary(tmp_path, "seeded", **{"noise-mode": mode, "seed": 7})
    text = seeded["threat_model"]
    assert "seeded (secure = false)" in text and "seed 7" in text
    assert "only while the seed is secret" in text
    assert ("shares protect nothing from the server" in text) == (mode == "distributed")
    secure = _summary(tmp_path, "secure", **{"noise-mode": mode, "secure": True})
    assert "seed" not in secure["threat_model"]
    assert secure["threat_model"].startswith("user-level DP of every released model")


class _SaysNothing(ToyClassificationTask):
    """The toy task without ``private_evaluation_users`` (a task of one's own, unknown)."""

    private_evaluation_users = None


class _CannotSay(ToyClassificationTask):
    """The toy task whose ``private_evaluation_users`` fails (its index file is gone)."""

    def private_evaluation_users(self) -> tuple[int, int]:
        raise OSError("evaluation index gone")


@pytest.mark.parametrize("cls", [_SaysNothing, _CannotSay])
def test_2_unknown_evaluation_users_are_not_called_publishable(tmp_path: Path, cls) -> None:
    config = load_config(TOY, {"num-server-rounds": 1})
    simulate(config, tmp_path / "run", task=cls(num_users=40, seed=0))
    text = json.loads((tmp_path / "run" / "summary.json").read_text())["not_covered"]
    assert "epsilon and evaluations" not in text
    assert f"{cls.__name__}.private_evaluation_users() does not say" in text
    assert text.endswith("only if the task evaluates users outside the private population")


def test_3_wall_time_is_named_outside_epsilon(tmp_path: Path) -> None:
    private = _summary(tmp_path, "private")
    assert "seconds, the round's wall time, follows the cohort's size" in private["not_covered"]
    _summary(tmp_path, "plain", strategy="fedavg")
    sentence = "s/round is wall time: it follows the sizes of the sampled cohorts"
    both = [load_run(tmp_path / "private"), load_run(tmp_path / "plain")]
    text = write_report(tmp_path / "report", both, title="t").read_text()
    assert sentence in text and "Full-precision numbers: [summary.csv](summary.csv)." in text
    alone = write_report(tmp_path / "plain-report", both[1:], title="t").read_text()
    assert sentence not in alone


def test_4_tuning_privacy_note_keeps_the_trials_run_seeds_secret() -> None:
    text = privacy_note(PrivacyPlan(ledger=None, point={}, delta=1e-5, accountant="rdp"))
    assert "so do the trials' run seeds (trials.csv, best.seed) of seeded runs" in text
    assert "the released trial's too" in text


def test_5_a_report_of_seeded_runs_says_the_seeds_are_secrets(tmp_path: Path) -> None:
    _summary(tmp_path, "seeded")
    _summary(tmp_path, "secure", secure=True, seed=1)
    runs = [load_run(tmp_path / "seeded"), load_run(tmp_path / "secure")]
    with pytest.warns(Warning, match="beyond the seed"):  # one row mixes secure and seeded
        text = write_report(tmp_path / "both", runs, title="t").read_text()
    assert "- seeded runs: 1 of the 2 private runs (secure = false)" in text
    assert "only while the seeds are secret" in text
    alone = write_report(tmp_path / "alone", runs[1:], title="t").read_text()
    assert "seeded runs" not in alone


@pytest.mark.parametrize(
    ("overrides", "how"),
    [
        ({}, "differing in one user added or removed (Poisson sampling)"),
        ({"sampling": "fixed"}, "differing in one user replaced (fixed-size sampling"),
        ({"noise-mechanism": "tree"}, "replace-special relation (tree aggregation)"),
    ],
)
def test_6_the_threat_model_names_the_neighbouring_relation(tmp_path, overrides, how) -> None:
    assert how in _summary(tmp_path, "run", **overrides)["threat_model"]
