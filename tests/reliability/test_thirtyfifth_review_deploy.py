"""Issue 15, thirty-fifth hostile review (the deployment): regression tests.

1. ``deploy local toy.toml --nodes 2 --insecure --rounds 3 --set round-timeout=5`` (also 1 and
   10; the run config takes any ``round-timeout`` of at least 1 s, the floor of Flower's
   simulation engine): a deployment's node asks the SuperLink for messages every 3 s and starts
   a ClientApp process for each (6-11 s here), so no reply came within the timeout. Every
   sampled user of every round was counted ``timed_out`` (``metrics.jsonl``: ``received`` 0 of
   9, 13 and 10), every released model was noise only, and the command ended rc 0 with ``3 rounds
   (rounds), eval_accuracy = 0.3867, epsilon = 12.17`` (0.61 after 2 rounds with the default
   timeout) and nothing more. Now ``deploy local`` reads the run's rows after it and says, in one
   ``warning:`` line on stderr, in how many rounds no sampled user's update reached the server,
   that those models are noise only but charged, and why (the causes the round metrics name:
   here the timeout, with its value and why a deployment needs more). Rounds that sampled nobody
   do not count; the causes are named, not counted (those metrics are not covered by ε). rc stays
   0, as for a diverged run's warning: the run did what it was asked and its ledger is true.
2. ``deploy local toy.toml --nodes 1 --set eval-every=2``: the progress line of a round without
   evaluation read ``[deploy] round 1: , epsilon=7.551`` (an empty list of metrics and its
   comma). Now ``[deploy] round 1: epsilon=7.551``; evaluated rounds are unchanged.
3. The Python API ``deploy_local`` (``fedprivopt.deploy.deploy_local``, documented beside the
   command) checked ``--timeout`` as any number in (0, inf) and ``--nodes`` only as >= 1, where
   the command line takes 30 days and [1, 64] nodes, at most the population:
   ``deploy_local(nodes=1, timeout=1e12, out=D, ...)`` wrote ``D/deploy`` and ended in
   ``OverflowError: date value out of range`` (the TLS certificates' validity, from the
   deadline); ``timeout=True`` ran as 1 s (``TimeoutError: the SuperLink did not open ... in
   time``); ``nodes=100000`` would start SuperNodes until ``Too many open files`` (the seventh
   review's F8), ``nodes=41`` of 40 users one node with nothing to do. Now ``ValueError`` naming
   the flag and its range before anything is written, from the checks the command line uses
   (``local.check_timeout``, ``local.check_nodes``; the bounds in ``fedprivopt.deploy``, which
   the command line's help reads without importing the deployment tooling).
4. The other arguments of ``deploy_local`` of another type: ``out=None``, ``config_path=123``
   (``TypeError: expected str, bytes or os.PathLike object``), ``overrides=[("seed", 1)]``
   (``AttributeError: 'list' object has no attribute 'get'``), ``progress=5`` (the deployment's
   working directory made and then ``'int' object is not callable`` at its first progress
   line), ``tls="false"`` (deployed with TLS: a non-empty string is true). Now ``ValueError``
   naming the argument before anything is written (``local._check_arguments``).
5. fedprivopt installed from a wheel (``pip install /path/to/fedprivopt``, as docs/SCALING.md
   installs it on a cluster's nodes), then ``fedprivopt deploy local --nodes 1`` (with or without
   a preset): rc 2 with ``cannot read the Flower app config '.../site-packages/pyproject.toml':
   [Errno 2] No such file or directory``, a path the user never gave, and nothing said that a
   deployment runs the Flower app of a source tree (reproduced with a copy of the package on
   ``PYTHONPATH``). Now the one line says so and how to install it (``local.check_app``, also in
   ``deploy_local``); another ``app_dir`` without one is refused as before.
6. ``deploy local --nodes 2 --set task-params-json='{"num-users": 40, "seed": 0}' --set
   task-params.seed=1`` (without a preset, the app's run config is the base and both are its
   keys): the run used seed 0 (``task-params-json`` replaces every ``task-params.<key>``), and
   ``--set strategy=adadps --set strategy-options-json='{"server-momentum": 0.5}' --set
   server-momentum=0.9`` momentum 0.5, without a word, where two different ``--set`` values of
   one key are refused (nineteenth review). Now rc 2 before anything starts, one line naming the
   key (``runconfig.refuse_double_settings``); a flat value equal to the JSON's is taken.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedprivopt.deploy import local as deploy_module
from fedprivopt.strategies.flower_replies import LOSS_METRICS
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import usage_error


def _row(round_num: int, cohort: int, received: int, **lost: int) -> dict:
    causes = dict.fromkeys(LOSS_METRICS, 0.0) | {k: float(v) for k, v in lost.items()}
    return {"round": round_num, "epsilon": 7.5 + round_num, "delta": 1e-4, "eval_loss": 1.1,
            "eval_accuracy": 0.43, "cohort_size": float(cohort), "received": float(received),
            **causes}  # fmt: skip


@pytest.fixture
def finished(monkeypatch):
    """``deploy_local`` replaced by one that writes the given rows and a summary, as a run does."""
    rows: list[dict] = []

    def deployed(*, out: str, **_: object) -> Path:
        run = Path(out)
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"rounds_completed": len(rows), "stopped_reason": "rounds", "epsilon": 12.17,
                   "delta": 1e-4, "final": {"eval_accuracy": 0.3867}, "diverged": None,
                   "config": {"round-timeout": 5}}  # fmt: skip
        (run / "summary.json").write_text(json.dumps(summary))
        return run

    monkeypatch.setattr(deploy_module, "deploy_local", deployed)
    return rows


def _deploy(out: Path) -> tuple[int, str, str]:
    return run_cli(["deploy", "local", "--nodes", "2", "--insecure", "--rounds", "3", "--set",
                    "round-timeout=5", "--out", str(out), "--quiet"])  # fmt: skip


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def test_1_rounds_no_update_reached_are_said_with_the_timeout(tmp_path, finished):
    finished += [_row(1, 9, 0, timed_out=9), _row(2, 13, 0, timed_out=13),
                 _row(3, 10, 0, timed_out=10)]  # fmt: skip
    code, out, err = _deploy(tmp_path / "d")
    assert code == 0 and "3 rounds (rounds)" in out, err
    (line,) = _warnings(err)
    assert "no sampled user's update reached the server in any round" in line, line
    assert "noise only, charged all the same (epsilon = 12.17)" in line, line
    assert "round-timeout = 5 s" in line and "every 3 s" in line, line
    assert "9" not in line and "13" not in line  # the round metrics are not covered by epsilon


def test_1_some_rounds_and_other_causes_are_named(tmp_path, finished):
    finished += [_row(1, 4, 0, failed=3, unhosted=1), _row(2, 0, 0), _row(3, 5, 2, timed_out=3)]
    code, _, err = _deploy(tmp_path / "d")
    (line,) = _warnings(err)  # round 2 sampled nobody: not counted
    assert code == 0 and "in 1 of the 3 rounds" in line, line
    assert "their nodes failed; no node hosts them" in line and "round-timeout" not in line, line
    from fedprivopt.deploy.cli import _CAUSES

    assert set(_CAUSES) == set(LOSS_METRICS)  # every cause the strategy counts is named


def test_1_a_run_whose_rounds_got_updates_has_no_warning(tmp_path, finished):
    finished += [_row(1, 9, 9), _row(2, 13, 11, timed_out=2)]
    code, _, err = _deploy(tmp_path / "d")
    assert code == 0 and _warnings(err) == [], err


class _Procs:
    """The process set of a deployment whose log stream never ends (``follow`` reads the files)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self, *_: object) -> object:
        return type("Running", (), {"poll": staticmethod(lambda: None)})()


def test_2_a_round_without_evaluation_has_a_plain_progress_line(tmp_path):
    from fedprivopt.deploy.session import follow

    said: list[str] = []
    dep = type("Dep", (), {"procs": _Procs(tmp_path), "say": staticmethod(said.append),
                           "check_alive": staticmethod(lambda: None)})()  # fmt: skip
    rows = [{"round": 1, "epsilon": 7.5508}, _row(2, 13, 11)]  # eval-every = 2
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text("{}")
    follow(dep, tmp_path, "1", deadline=float("inf"))
    evaluated = "round 2: eval_loss=1.1000, eval_accuracy=0.4300, epsilon=9.5"
    assert said == ["round 1: epsilon=7.551", evaluated], said


SMALL = {"population": 6, "task-params.num-users": 6, "clients-per-round": 3}


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (
            {"timeout": 1e12},
            "--timeout must be a number of seconds in (0, 2.592e+06], got 1000000000000.0",
        ),
        ({"timeout": True}, "--timeout must be a number of seconds in (0, 2.592e+06], got True"),
        ({"timeout": float("nan")}, "--timeout must be"),
        ({"nodes": 100000}, "--nodes must be an integer in [1, 64], got 100000"),
        ({"nodes": 7}, "--nodes must be at most the population (6 users"),
        ({"nodes": 2.0}, "--nodes must be an integer in [1, 64], got 2.0"),
    ],
)
def test_3_the_python_api_checks_timeout_and_nodes_as_the_command_line(tmp_path, kwargs, needle):
    args = {"nodes": 1, "tls": False, "overrides": SMALL, "out": str(tmp_path / "d")} | kwargs
    with pytest.raises(ValueError) as refused:
        deploy_module.deploy_local(**args)
    assert needle in str(refused.value), refused.value
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"out": None}, "out must be a path, got None"),
        ({"config_path": 123}, "config_path must be a path, got 123"),
        ({"app_dir": 1.5}, "app_dir must be a path"),
        ({"overrides": [("seed", 1)]}, "overrides must be a mapping"),
        ({"progress": 5}, "progress must be callable or None, got 5"),
        ({"tls": "false"}, "tls must be true or false, got 'false'"),
        ({"node_auth": 1}, "node_auth must be true or false, got 1"),
    ],
)
def test_4_the_python_api_names_an_argument_of_another_type(tmp_path, kwargs, needle):
    args = {"nodes": 1, "tls": False, "overrides": SMALL, "out": str(tmp_path / "d")} | kwargs
    with pytest.raises(ValueError) as refused:
        deploy_module.deploy_local(**args)
    assert needle in str(refused.value), refused.value
    assert list(tmp_path.iterdir()) == []


def test_5_an_installation_without_a_source_tree_says_what_deploy_local_needs(
    tmp_path, monkeypatch
):
    installed = tmp_path / "site-packages"
    installed.mkdir()
    monkeypatch.setattr(deploy_module, "REPO_ROOT", installed)
    argv = ["deploy", "local", "--nodes", "1", "--insecure", "--out", str(tmp_path / "d")]
    line = usage_error(run_cli(argv), "source tree", "pip install -e", str(installed))
    assert "Errno" not in line, line
    with pytest.raises(ValueError, match="source tree"):
        deploy_module.deploy_local(nodes=1, tls=False, out=str(tmp_path / "d"))
    with pytest.raises(ValueError, match="is not a Flower app"):  # another app as before
        deploy_module.deploy_local(nodes=1, tls=False, out=str(tmp_path / "d"), app_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site-packages"]


@pytest.fixture
def not_started(monkeypatch):
    """``deploy_local`` replaced by a failure: what the command says before it starts anything."""

    def refuse(**_: object) -> Path:
        raise RuntimeError("not started (test)")

    monkeypatch.setattr(deploy_module, "deploy_local", refuse)


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (['task-params-json={"num-users": 40, "seed": 0}', "task-params.seed=1"],
         "task-params.seed=1 is not used: task-params-json replaces"),
        (['task-params-json={"num-users": 40}', "task-params.seed=0"],
         "task-params.seed=0 is not used"),
        (["strategy=adadps", 'strategy-options-json={"server-momentum": 0.5}',
          "server-momentum=0.9"], "server-momentum=0.9 contradicts server-momentum = 0.5"),
    ],
)  # fmt: skip
def test_6_a_set_value_the_json_keys_would_replace_is_refused(tmp_path, not_started, sets, needle):
    argv = ["deploy", "local", "--nodes", "2", "--insecure", "--out", str(tmp_path / "d")]
    usage_error(run_cli([*argv, *(a for s in sets for a in ("--set", s))]), needle)
    assert list(tmp_path.iterdir()) == []


def test_6_a_flat_value_equal_to_the_jsons_is_taken(tmp_path, not_started):
    sets = ['task-params-json={"num-users": 40, "seed": 0}', "task-params.seed=0"]
    argv = ["deploy", "local", "--nodes", "2", "--insecure", "--out", str(tmp_path / "d")]
    code, _, err = run_cli([*argv, *(a for s in sets for a in ("--set", s))])
    assert code == 1 and "not started (test)" in err, err
