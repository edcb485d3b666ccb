"""The issue-20 review of private tuning: findings 1-4, 6, 8 and 10, each a failing case before."""

import json
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.core.text import epsilon_text

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "simulations" / "toy.toml"
TAG_MINI = ROOT / "simulations" / "stackoverflow-tp-mini.toml"
SMALL = ["--set", "population=16", "--set", "clients-per-round=4",
         "--set", "task-params.num-users=16", "--quiet"]  # fmt: skip


def _exit_code(argv):
    """``main``'s exit code; argparse's own errors exit through ``SystemExit``."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _tag_tune(data_dir: Path, out: Path, split: str, *extra: str) -> list[str]:
    """A 1-round, one-trial tuning of a tag task on a tiny synthetic dataset in ``data_dir``."""
    sets = {
        "data-dir": str(data_dir), "synth-clients": 30, "synth-vocab": 300, "synth-tags": 10,
        "synth-seed": 0, "vocab-size": 200, "num-tags": 8, "num-users": 24, "eval-users": 4,
        "eval-split": split,
    }  # fmt: skip
    argv = ["tune", str(TAG_MINI), "--strategy", "dp-fedavg", "--grid",
            "server-learning-rate=0.5,1", "--mean-trials", "1", "--distribution", "poisson",
            "--rounds", "1", "--out", str(out), "--quiet", "--set", "population=24",
            "--set", "clients-per-round=4", *extra]  # fmt: skip
    for key, value in sets.items():
        argv += ["--set", f"task-params.{key}={value}"]
    return argv


def test_selection_on_private_users_is_refused(tmp_path, capsys):
    """Finding 2: eval-split test holds later posts of the training users; tune selected on them.

    Before, tune accepted it and claimed the selection was covered. Now it is refused (rc 2, one
    line naming task-params.eval-split and heldout); heldout is accepted and said covered; the
    flag tunes anyway and the summary says the selection is NOT covered.
    """
    data = tmp_path / "so"
    assert _exit_code(_tag_tune(data, tmp_path / "t1", "test")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "task-params.eval-split" in err and "heldout" in err
    assert "Traceback" not in err and not (tmp_path / "t1" / "tune.json").exists()
    assert _exit_code(_tag_tune(data, tmp_path / "t2", "heldout")) == 0
    summary = json.loads((tmp_path / "t2" / "summary.json").read_text())
    assert summary["selection_users"]["private"] == 0 and summary["selection_covered"] is True
    out = tmp_path / "t3"
    assert _exit_code(_tag_tune(data, out, "test", "--selection-on-private-users")) == 0
    summary = json.loads((out / "summary.json").read_text())
    private = summary["selection_users"]["private"]
    assert private > 0 and summary["selection_covered"] is False
    assert "NOT covered" in summary["privacy"]
    assert f"{private} of the task's" in (out / "report.md").read_text()


def test_toy_selection_is_covered(tmp_path):
    """Finding 2: toy's evaluation is a separate draw, so its selection is checked and covered."""
    out = tmp_path / "t"
    argv = ["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid",
            "server-learning-rate=0.5,1", "--mean-trials", "1", "--rounds", "1", "--out",
            str(out), *SMALL]  # fmt: skip
    assert _exit_code(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["selection_users"] == {"private": 0, "evaluated": 0}
    assert "Selection: covered" in (out / "report.md").read_text()


def test_unknown_overlap_is_not_checked():
    """Finding 2: a task without the method is not refused; the summary says 'not checked'."""
    from types import SimpleNamespace

    from fedprivopt.cli_tune_setup import check_selection
    from fedprivopt.simulation.tune_notes import selection_note

    assert check_selection(SimpleNamespace(), [object()]) is None
    assert "not checked" in selection_note(None)
    with pytest.raises(Exception, match="eval-split"):
        overlapping = SimpleNamespace(private_evaluation_users=lambda: (1, 4))
        check_selection(SimpleNamespace(), [overlapping])


def _toy_tune(out: Path, *extra: str) -> list[str]:
    return ["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid",
            "server-learning-rate=0.5,1", "--mean-trials", "2", "--rounds", "1", "--out",
            str(out), *SMALL, *extra]  # fmt: skip


def test_default_tuning_seed_is_secret(tmp_path, capsys):
    """Finding 1: the default tuning seed was the preset's (0, public), so K was known.

    Now it comes from OS entropy, is kept only in tune.json (summary.json: null), nothing printed
    shows it, a second call into the same directory goes on with it, and compare-tuned reads it.
    """
    a, b = tmp_path / "a", tmp_path / "b"
    assert _exit_code(_toy_tune(a)) == 0
    assert _exit_code(_toy_tune(b)) == 0
    printed = capsys.readouterr()
    seeds = [json.loads((d / "tune.json").read_text())["seed"] for d in (a, b)]
    assert seeds[0] != seeds[1] and 0 not in seeds
    assert all(str(s) not in printed.out + printed.err for s in seeds)
    for d in (a, b):
        summary = json.loads((d / "summary.json").read_text())
        assert summary["seed"] is None and summary["seed_source"] == "os-entropy"
        assert str(seeds[0]) not in (d / "report.md").read_text()
        assert "OS entropy" in summary["privacy"]
    assert _exit_code(_toy_tune(a)) == 0  # the same plan: its trials are reused
    assert json.loads((a / "tune.json").read_text())["seed"] == seeds[0]
    assert _exit_code(["compare-tuned", str(a), str(b), "--out", str(tmp_path / "r")]) == 0
    given = tmp_path / "given"
    assert _exit_code(_toy_tune(given, "--seed", "7")) == 0
    summary = json.loads((given / "summary.json").read_text())
    assert summary["seed"] == 7 and "stays secret" in summary["privacy"]


def test_tuning_epsilon_is_repeat_and_select_of_the_costliest_run(tmp_path):
    """Finding 3: a cheaper grid point's failed RDP orders were dropped, raising ε 15.796 to 16.383.

    The tuning ε is now dp-accounting's RepeatAndSelectDpEvent of the costliest run (σ 0.5), the
    same as the single-σ grid's, and compare-tuned's recomputation agrees.
    """
    import dp_accounting as dpa
    from dp_accounting import dp_event, rdp

    from fedprivopt.privacy.events import SubsampledGaussianEvent
    from fedprivopt.privacy.tuning import run_dp_event

    def tune(out, grid):
        argv = ["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid", grid, "--mean-trials",
                "2", "--rounds", "3", "--seed", "0", "--out", str(out), *SMALL]  # fmt: skip
        assert _exit_code(argv) == 0
        return json.loads((out / "summary.json").read_text())

    mixed = tune(tmp_path / "mixed", "noise-multiplier=0.5,1")
    single = tune(tmp_path / "single", "server-learning-rate=0.5,1")
    assert mixed["single_run"]["grid_point"] == {"noise-multiplier": 0.5}
    ledger = [(SubsampledGaussianEvent.from_dict(e["event"]), e["count"])
              for e in mixed["single_run"]["ledger"]]  # fmt: skip
    accountant = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(dp_event.RepeatAndSelectDpEvent(run_dp_event(ledger), 2.0, 1.0))
    expected = accountant.get_epsilon(mixed["delta"])
    assert mixed["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert mixed["epsilon"] == pytest.approx(15.796, abs=1e-3)
    assert mixed["epsilon"] == pytest.approx(single["epsilon"], rel=1e-12)
    from fedprivopt.simulation.tune_check import check_tuning

    assert check_tuning(tmp_path / "mixed").epsilon == pytest.approx(expected, rel=1e-9)


def test_tuned_compare_report_is_the_operators_view_and_composes_a_row(tmp_path):
    """Findings 1c and 4: the report said ε was each run's, hid the composition of a row's
    tunings, and showed K and the seeds beside the tuning ε without saying that publishing
    them is not covered."""
    from fedprivopt.privacy.events import SubsampledGaussianEvent
    from fedprivopt.privacy.tuning import TrialCount, composed_tuning_epsilon, tuning_epsilon

    out = tmp_path / "cmp"
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg", "--seeds", "2",
            "--tune-grid", "server-learning-rate=0.5,1", "--mean-trials", "1.5", "--rounds", "1",
            "--out", str(out), *SMALL]  # fmt: skip
    assert _exit_code(argv) == 0
    text = (out / "report.md").read_text()
    assert "after each run's last completed round" not in text
    assert "ε of every row here is its tuning's" in text
    assert "operator's view" in text and "NOT covered" in text
    summary = json.loads(next((out / "tune").glob("*/summary.json")).read_text())
    ledger = [(SubsampledGaussianEvent.from_dict(e["event"]), e["count"])
              for e in summary["single_run"]["ledger"]]  # fmt: skip
    trials = TrialCount("truncated-negative-binomial", 1.5, shape=1.0)
    one = tuning_epsilon(ledger, summary["delta"], trials)
    two = composed_tuning_epsilon(ledger, summary["delta"], trials, 2)
    assert one < two <= 2 * one + 1e-9
    shown = epsilon_text(two)  # rounded up (thirty-ninth review of issue 15)
    assert f"| dp-fedavg (tuned) | 0.5 | 2 | {shown} |" in text or f"| 2 | {shown} |" in text


def test_mixed_mechanism_refusal_names_tree(tmp_path, capsys):
    """Finding 6: a Gaussian/tree grid was refused as a mix of Poisson and fixed-size sampling."""
    argv = ["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid",
            "noise-mechanism=gaussian,tree", "--mean-trials", "1", "--rounds", "2", "--out",
            str(tmp_path / "t"), *SMALL]  # fmt: skip
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--grid" in err
    assert "Poisson sampling and tree aggregation" in err and "fixed" not in err


def test_a_refusal_does_not_print_the_secret_seed(tmp_path, capsys):
    """Finding 1: a second call with --seed into a directory of a secret seed named it."""
    out = tmp_path / "t"
    assert _exit_code(_toy_tune(out)) == 0
    secret = json.loads((out / "tune.json").read_text())["seed"]
    capsys.readouterr()
    assert _exit_code(_toy_tune(out, "--seed", "3")) == 2
    err = capsys.readouterr().err
    assert "--seed" in err and "secret" in err and str(secret) not in err
