import csv
from pathlib import Path

from fedprivopt.cli import main

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
SMALL = [
    "--set",
    "population=12",
    "--set",
    "clients-per-round=4",
    "--set",
    "task-params.num-users=12",
]


def test_compare_runs_the_grid_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = [
        "compare",
        str(PRESET),
        "--strategies",
        "dp-fedavg,dp-fedadam,fedavg",
        "--noise-multipliers",
        "0.5,2",
        "--seeds",
        "2",
        "--rounds",
        "3",
        "--out",
        str(out),
        "--quiet",
        *SMALL,
    ]
    assert main(argv) == 0
    assert f"report: {out / 'report.md'}" in capsys.readouterr().out
    with open(out / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    cells = {(r["strategy"], float(r["noise_multiplier"])) for r in rows}
    assert cells == {
        ("dp-fedavg", 0.5),
        ("dp-fedavg", 2.0),
        ("dp-fedadam", 0.5),
        ("dp-fedadam", 2.0),
        ("fedavg", 0.0),
    }
    assert all(r["seeds"] == "2" for r in rows)
    eps = {(r["strategy"], float(r["noise_multiplier"])): float(r["epsilon"]) for r in rows}
    assert eps[("dp-fedavg", 2.0)] < eps[("dp-fedavg", 0.5)] == eps[("dp-fedadam", 0.5)]
    assert eps[("fedavg", 0.0)] == float("inf")
    for name in ("metric_vs_round.png", "privacy_utility.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "dp-fedadam" in report and "privacy_utility.png" in report
    assert len(list((out / "runs").iterdir())) == 2 * 2 * 2 + 2
    # a second call reuses the finished runs
    stamp = (out / "runs" / "dp-fedavg__sigma0.5__seed0" / "summary.json").stat().st_mtime_ns
    assert main(argv) == 0
    assert (
        out / "runs" / "dp-fedavg__sigma0.5__seed0" / "summary.json"
    ).stat().st_mtime_ns == stamp


def test_compare_rejects_unknown_strategies(tmp_path, capsys):
    code = main(
        [
            "compare",
            str(PRESET),
            "--strategies",
            "dp-fedavg,sgd",
            "--out",
            str(tmp_path / "x"),
            "--quiet",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--strategies" in err and "'sgd'" in err
    assert not (tmp_path / "x").exists()


def test_compare_without_strategies_runs_every_registered_strategy(tmp_path):
    from fedprivopt.strategies import STRATEGIES

    out = tmp_path / "all"
    argv = ["compare", str(PRESET), "--rounds", "1", "--out", str(out), "--quiet", *SMALL]
    assert main(argv) == 0
    with open(out / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["strategy"] for r in rows) == sorted(STRATEGIES)
