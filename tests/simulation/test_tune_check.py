"""``compare-tuned`` checks a tuning's files before it reports it (seventh review: F2, F3, F4)."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from fedprivopt.cli import main

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = ["--set", "population=12", "--set", "clients-per-round=4",
         "--set", "task-params.num-users=12", "--quiet"]  # fmt: skip


def _tune(out, *extra, rounds="2", seed="3"):
    argv = ["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid",
            "noise-multiplier=0.5,50", "--mean-trials", "2", "--out", str(out),
            "--rounds", rounds, "--seed", seed, *SMALL, *extra]  # fmt: skip
    assert main(argv) == 0


@pytest.fixture(scope="module")
def tunings(tmp_path_factory):
    """Two tunings of one configuration (seeds 3 and 4) and one with another round count."""
    root = tmp_path_factory.mktemp("tunings")
    _tune(root / "a")
    _tune(root / "b", seed="4")
    _tune(root / "rounds", rounds="3")
    return root


def _copy(tunings, tmp_path, name="a"):
    out = tmp_path / name
    shutil.copytree(tunings / name, out)
    return out


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _compare(capsys, *tuned, out):
    capsys.readouterr()
    rc = main(["compare-tuned", *map(str, tuned), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    if rc == 2:
        assert len(err.splitlines()) == 1 and "Traceback" not in err
    return rc, err


def _reported(out):
    with open(out / "summary.csv") as fh:
        return [r for r in csv.DictReader(fh)]


def test_an_untouched_tuning_is_reported_at_its_epsilon(tunings, tmp_path, capsys):
    rc, _ = _compare(capsys, tunings / "a", out=tmp_path / "r")
    assert rc == 0
    stated = json.loads((tunings / "a" / "summary.json").read_text())["epsilon"]
    (row,) = _reported(tmp_path / "r")
    assert float(row["epsilon"]) == pytest.approx(stated, rel=1e-12)


def test_an_edited_single_run_ledger_does_not_lower_epsilon(tunings, tmp_path, capsys):
    """F2: the single run's noise multiplier and the stated epsilon edited down."""
    tuned = _copy(tunings, tmp_path)
    stated = json.loads((tuned / "summary.json").read_text())["epsilon"]

    def lower(s):
        s["single_run"]["ledger"][0]["event"]["noise_multiplier"] = 50.0
        s["epsilon"] = 0.01

    _edit(tuned / "summary.json", lower)
    rc, _ = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 0
    (row,) = _reported(tmp_path / "r")
    assert float(row["epsilon"]) == pytest.approx(stated, rel=1e-12)


@pytest.mark.parametrize(
    "files, change, named",
    [
        (["summary.json"], lambda s: s["trial_count"].update(mean=1.0), "summary.json"),
        (["summary.json"], lambda s: s.update(delta=0.5), "summary.json"),
        (["summary.json", "tune.json"], lambda s: s.update(delta=0.5), "tune.json"),
        (["summary.json", "tune.json"], lambda s: s.update(seed=5), "tune.json"),
        (["tune.json"], lambda s: s.update(base_config=s["base_config"].replace(
            "num-server-rounds = 2", "num-server-rounds = 1")), "config.toml"),
    ],
)  # fmt: skip
def test_edited_distribution_or_delta_is_refused(tunings, tmp_path, capsys, files, change, named):
    """F2: the trial distribution, delta or seed edited in one file or both."""
    tuned = _copy(tunings, tmp_path)
    for name in files:
        _edit(tuned / name, change)
    rc, err = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 2 and named in err


def test_a_tuning_without_its_plan_is_refused(tunings, tmp_path, capsys):
    tuned = _copy(tunings, tmp_path)
    (tuned / "tune.json").unlink()
    rc, err = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 2 and "tune.json" in err


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_best_run_dir_outside_the_tunings_runs_is_refused(tunings, tmp_path, capsys, where):
    """F2: best.run_dir pointing at another tuning's run."""
    tuned = _copy(tunings, tmp_path)
    other = tunings / "rounds" / "runs" / "trial-001"
    target = str(other) if where == "absolute" else f"../../{other.relative_to(tunings.parent)}"
    _edit(tuned / "summary.json", lambda s: s["best"].update(run_dir=target))
    rc, err = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 2 and "best.run_dir" in err
    assert not (tmp_path / "r").exists()


def test_another_run_in_the_best_trials_directory_is_refused(tunings, tmp_path, capsys):
    """F3: the best trial's directory replaced by a run of another configuration."""
    tuned = _copy(tunings, tmp_path)
    best = json.loads((tuned / "summary.json").read_text())["best"]["trial"]
    shutil.rmtree(tuned / "runs" / best)
    shutil.copytree(tunings / "b" / "runs" / "trial-001", tuned / "runs" / best)
    rc, err = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 2 and "config.toml" in err


def test_one_tuning_given_twice_is_refused(tunings, tmp_path, capsys):
    """F4: ``t`` and ``t/`` are one tuning, not two seeds."""
    rc, err = _compare(capsys, tunings / "a", f"{tunings / 'a'}/", out=tmp_path / "r")
    assert rc == 2 and "once" in err
    copy = _copy(tunings, tmp_path)  # a copy has the same tuning seed
    rc, err = _compare(capsys, tunings / "a", copy, out=tmp_path / "r")
    assert rc == 2 and "seed" in err


def test_tunings_of_other_configurations_are_not_seeds(tunings, tmp_path, capsys):
    """F4: two tunings that differ in rounds would be merged into one row."""
    rc, err = _compare(capsys, tunings / "a", tunings / "rounds", out=tmp_path / "r")
    assert rc == 2 and "num-server-rounds" in err
    rc, _ = _compare(capsys, tunings / "a", tunings / "b", out=tmp_path / "r")
    assert rc == 0
    rows = _reported(tmp_path / "r")  # grouped by the released noise multiplier
    assert sum(int(r["seeds"]) for r in rows) == 2


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update(epsilon=float("nan")),
        lambda s: s.update(epsilon="16.6 approx"),
        lambda s: s.update(epsilon=-1.0),
        lambda s: s["single_run"]["ledger"][0]["event"].update(noise_multiplier=float("nan")),
    ],
    ids=["nan", "text", "negative", "ledger-nan"],
)
def test_a_malformed_stated_epsilon_is_refused_naming_the_summary(tunings, tmp_path, capsys,
                                                                   change):  # fmt: skip
    """Eighth review F3: a NaN epsilon was reported as 'nan'; text lost the file's name."""
    tuned = _copy(tunings, tmp_path)
    _edit(tuned / "summary.json", change)
    rc, err = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 2 and "summary.json" in err
    assert not (tmp_path / "r").exists()


def test_a_metric_no_run_reports_names_the_flag(tunings, tmp_path, capsys):
    """Eighth review F3 (m2): the error named 'metric', not ``--metric``, and made --out."""
    capsys.readouterr()
    rc = main(["compare-tuned", str(tunings / "a"), "--metric", "eval_recall_at_5",
               "--out", str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--metric" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_best_that_is_not_the_runs_argmax_is_refused(tunings, tmp_path, capsys):
    """Eighth review F4: ``best`` edited to a worse trial was reported as the tuned release."""
    tuned = _copy(tunings, tmp_path, "b")  # two trials
    summary = json.loads((tuned / "summary.json").read_text())
    others = [t["trial"] for t in summary["trials"] if t["trial"] != summary["best"]["trial"]]
    assert others, "the fixture tuning needs two trials"
    _edit(tuned / "summary.json",
          lambda s: s["best"].update(trial=others[0], run_dir=f"runs/{others[0]}"))  # fmt: skip
    rc, err = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 2 and "summary.json" in err and summary["best"]["trial"] in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("inside", ["runs", "runs/trial-001", "."])
def test_a_tunings_trial_is_not_an_untuned_run(tunings, tmp_path, capsys, inside):
    """Eighth review F2: a tuning's own trials were shown as untuned rows at one run's ε."""
    capsys.readouterr()
    rc = main(["compare-tuned", str(tunings / "a"), "--untuned", str(tunings / "b" / inside),
               "--out", str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--untuned" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_untuned_runs_that_differ_beyond_the_seed_are_not_seeds(tunings, tmp_path, capsys):
    """Eighth review F2: untuned runs of one strategy and σ with other rounds were merged."""
    base = ["simulate", str(PRESET), "--strategy", "dp-fedavg", "--set", "noise-multiplier=1.0",
            *SMALL[:-1]]  # fmt: skip
    assert main([*base, "--rounds", "1", "--seed", "1", "--out", str(tmp_path / "u" / "a")]) == 0
    assert main([*base, "--rounds", "2", "--seed", "2", "--out", str(tmp_path / "u" / "b")]) == 0
    capsys.readouterr()
    rc = main(["compare-tuned", str(tunings / "a"), "--untuned", str(tmp_path / "u"),
               "--out", str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "num-server-rounds" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("where", [".", "runs", "runs/rep"])
def test_out_inside_a_tuning_is_refused(tunings, tmp_path, capsys, where):
    """Eighth review m1: --out inside a tuning's runs/ broke the tuning."""
    tuned = _copy(tunings, tmp_path)
    before = sorted(p.name for p in (tuned / "runs").iterdir())
    rc, err = _compare(capsys, tuned, out=tuned / where)
    assert rc == 2 and "--out" in err
    assert sorted(p.name for p in (tuned / "runs").iterdir()) == before


# -- the plan's digest in every trial's ledger (seventeenth review of issue 15, findings 2, 2b) --


def _both(tuned, change):
    for name in ("tune.json", "summary.json"):
        _edit(tuned / name, change)


def _draws(plan, trial_count):
    from fedprivopt.simulation.tune import draw_trials

    grid = {k: tuple(v) for k, v in plan["grid"].items()}
    drawn = draw_trials(grid, trial_count, plan["seed"])
    return [(t.label, t.hyperparameters, t.seed) for t in drawn]


def test_every_trials_ledger_names_the_plan_of_tune_json(tunings):
    from fedprivopt.simulation.ledger import RunLedger
    from fedprivopt.simulation.tune_plan import plan_digest

    plan = json.loads((tunings / "a" / "tune.json").read_text())
    labels = [t["trial"] for t in plan["trials"]]
    assert labels
    for label in labels:
        header = RunLedger.read(tunings / "a" / "runs" / label).header
        assert header["tuning_plan"] == plan_digest(plan)


def test_a_trial_count_rewritten_in_both_files_is_refused(tunings, tmp_path, capsys):
    """Finding 2: a mean that still draws the same trials, edited in tune.json and summary.json."""
    from fedprivopt.privacy.tuning import TrialCount

    tuned = _copy(tunings, tmp_path)
    plan = json.loads((tuned / "tune.json").read_text())
    stated = plan["trial_count"]
    original = TrialCount(stated["distribution"], stated["mean"], stated["shape"])
    planned = [(t["trial"], t["hyperparameters"], t["seed"]) for t in plan["trials"]]
    means = [m / 100 for m in range(101, 400) if m / 100 != original.mean]
    same = [
        m
        for m in means
        if _draws(plan, TrialCount(original.distribution, m, original.shape)) == planned
    ]
    assert same, "no other mean draws these trials; the edit this test makes would be refused"
    lower = min(same)  # a smaller mean composes to a smaller epsilon
    edited = TrialCount(original.distribution, lower, original.shape).to_dict()
    _both(tuned, lambda d: d.update(trial_count=edited))
    rc, err = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 2
    assert "privacy_ledger.jsonl: its header names the tuning plan" in err
    assert not (tmp_path / "r" / "summary.csv").exists()


def test_a_grid_rewritten_in_both_files_is_refused(tmp_path, capsys):
    """Finding 2b: σ 0.5 dropped from the grid, so the single run's bound is the drawn σ 5's."""
    tuned = tmp_path / "t"
    argv = ["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid", "noise-multiplier=0.5,5",
            "--mean-trials", "1.5", "--seed", "3", "--rounds", "2", "--out", str(tuned),
            *SMALL]  # fmt: skip
    assert main(argv) == 0
    plan = json.loads((tuned / "tune.json").read_text())
    one = {"noise-multiplier": [5]}
    from fedprivopt.privacy.tuning import TrialCount

    count = TrialCount(**{k: plan["trial_count"][k] for k in ("distribution", "mean", "shape")})
    planned = [(t["trial"], t["hyperparameters"], t["seed"]) for t in plan["trials"]]
    assert _draws({**plan, "grid": one}, count) == planned  # the edit is consistent

    def drop(d):
        d["grid"] = one
        for x in (d.get("single_run") or {}).get("ledger") or []:
            x["event"]["noise_multiplier"] = 5.0

    _both(tuned, drop)
    rc, err = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 2
    assert "its header names the tuning plan" in err and "tune.json or the trial's" in err


def test_a_trial_without_the_plan_in_its_ledger_is_refused(tunings, tmp_path, capsys):
    """A header without the digest (removed, or written by an earlier version) is refused."""
    from fedprivopt.simulation.tune_plan import PLAN_FILE

    tuned = _copy(tunings, tmp_path)
    best = json.loads((tuned / "summary.json").read_text())["best"]["trial"]
    ledger = tuned / "runs" / best / "privacy_ledger.jsonl"
    lines = ledger.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    del header["tuning_plan"]
    ledger.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    rc, err = _compare(capsys, tuned, out=tmp_path / "r")
    assert rc == 2 and "names no tuning plan" in err
    # tune again into it: the trial is not this plan's, so it is not reused without --overwrite
    capsys.readouterr()
    assert main(["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid",
                 "noise-multiplier=0.5,50", "--mean-trials", "2", "--out", str(tuned),
                 "--rounds", "2", "--seed", "3", *SMALL]) == 2  # fmt: skip
    # fortieth review follow-up (ledger 5): refused by the checkpoint's copy of the header
    assert "tuning_plan is not the one checkpoint.pt recorded" in capsys.readouterr().err
    assert main(["tune", str(PRESET), "--strategy", "dp-fedavg", "--grid",
                 "noise-multiplier=0.5,50", "--mean-trials", "2", "--out", str(tuned),
                 "--rounds", "2", "--seed", "3", "--overwrite", *SMALL]) == 0  # fmt: skip
    rc, _ = _compare(capsys, tuned, out=tmp_path / "r2")
    assert rc == 0
    assert (tuned / PLAN_FILE).is_file()


# -- eighteenth review of issue 15, A and B: the tuning's files are checked before they are read --


@pytest.mark.parametrize("name", ["tune.json", "summary.json"])
def test_a_fifo_or_an_oversized_tuning_file_is_named(tunings, tmp_path, capsys, name):
    import os

    fifo = _copy(tunings, tmp_path, "a")
    (fifo / name).unlink()
    os.mkfifo(fifo / name)  # reading it would block forever
    rc, err = _compare(capsys, fifo, out=tmp_path / "r")
    assert rc == 2 and f"{name}: not a regular file" in err
    big = tmp_path / "big"
    shutil.copytree(tunings / "a", big)
    with open(big / name, "r+b") as fh:
        fh.truncate(20 << 30)  # sparse: 20 GB that reading whole would allocate
    rc, err = _compare(capsys, big, out=tmp_path / "r2")
    assert rc == 2 and f"{name}: 21474836480 bytes, more than" in err
