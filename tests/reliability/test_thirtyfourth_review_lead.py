"""Thirty-fourth review of issue 15 (the lead's part).

1. A joined Ray cluster's node that declares GPUs its torch cannot use: see
   ``tests/simulation/test_cluster.py`` (it needs the three-node test cluster there).
2. ``simulate toy.toml --set strategy=dp-fedavg --set side-information.kind=public-users --set
   side-information.users=3``: rc 0 without a word, and ``summary.json`` showed the
   ``[side-information]`` table that the run never used (only ``adadps`` reads it; the public
   users stayed in the private population). A ``--set side-information.*`` in ``compare`` for a
   strategy that is not ``adadps`` was as silent. Now both say, as for other strategies'
   options: ``note: dp-fedavg does not use side-information (…)``.
3. A joined cluster's head killed during the run: Ray ended the process a minute later with its
   C++ line and rc 1; now one line of ours and rc 2, before Ray would (see the tests).
4. ``ServerAlgorithm.load_state_dict`` of a state refused at its accountant left the algorithm
   half restored (see the test).
5. ``MPLBACKEND=bogus fedprivopt tune …``: no report after the trials (see the test).
6. A tuned comparison's report header counted its released trials' seeds as seeds of every
   group (see the test).
7. ``sys.exit(0)`` in a task's ``evaluate()`` (or the evaluation's ``build_model()``): rc 0
   and no line (the tasks reviewer's report; see the test).
8. ``deploy local`` said nothing of keys its strategy does not use (the deploy reviewer's
   finding 4, whose fix needed ``cli_runs.note_unused`` public; see the test).
9. A float64 model on the Flower engine: its updates went as float32 and were all rejected
   (the tasks reviewer's report; see the test).
10. A seeded redo refused after ``vectorize`` or the engine changed did not say they may be why
    (the engines reviewer's report A; see the test). Its report C, the Flower user query's
    refusals as ``RuntimeError`` tracebacks, is tested by ``ValueError`` in the thirty-first
    processes and thirty-third lead tests.
11. A TOML date or time as a task parameter: a ``TypeError`` traceback (the tasks reviewer's
    report; see the test).
12. A task's ``build_model()`` that exits, is lazy or is on the meta device: rc 0 without a
    line, or a traceback (the tasks reviewer's report; see the test).
13. A setting refused against AdaDPS' private population named it "population" (the thirty-third
    review's optim note; see the test).
"""

import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.cli_runs import load_preset, note_unused
from fedprivopt.deploy import local as deploy_module
from fedprivopt.simulation import report_markdown, tune_report
from fedprivopt.simulation.cluster_watch import HeadWatch
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_thirtyfourth_review_tasks import OwnTask

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
PUBLIC = {"side-information.kind": "public-users", "side-information.users": 3}


def _sets(*pairs: str) -> list[str]:
    return [word for pair in pairs for word in ("--set", pair)]


def test_2_simulate_says_a_strategy_does_not_use_side_information(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
               *_sets("strategy=dp-fedavg", *(f"{k}={v}" for k, v in PUBLIC.items()))])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0
    assert "note: dp-fedavg does not use side-information" in err
    # adadps reads it: no note
    note_unused([load_preset(TOY, {"strategy": "adadps", **PUBLIC})])
    assert "side-information" not in capsys.readouterr().err


def test_2_compare_notes_its_side_information_sets_per_strategy(capsys):
    sets = {"side-information.kind": "ones"}
    configs = [load_preset(TOY, {**sets, "strategy": name}) for name in ("dp-fedavg", "adadps")]
    note_unused(configs, sets)
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "side-information" in line] == [
        "note: dp-fedavg does not use side-information (other strategies' options, or ones it "
        "ignores)"
    ]
    note_unused(configs, {"clip-norm": 1.0})  # a preset's table that compare did not set
    assert "side-information" not in capsys.readouterr().err


def _listener() -> socket.socket:
    """A port that accepts connections, standing in for a head's GCS."""
    server = socket.create_server(("127.0.0.1", 0))
    server.listen()
    return server


def test_3_a_head_that_stops_answering_ends_the_run_in_one_line(tmp_path):
    """A joined cluster's head killed during the run (the thirty-third review's open item).

    ``simulate toy.toml --rounds 200 --set fast-actors=2 --set ray-address=H --set
    checkpoint-every=1``, the head's ``gcs_server`` killed with SIGKILL after round 3: the rounds
    went on (the shards answer the driver directly) and 61.7 s later Ray's C++ core ended the
    process with ``Failed to connect to GCS within 60 seconds … The program will terminate.``
    and rc 1. Now ``cluster_watch.HeadWatch`` ends it before Ray does: one line naming the key
    and the head, rc 2 (what the run wrote stays, as after a kill). Here a listening port stands
    in for the head, closed as a killed GCS closes it, in a child process the watch ends.
    """
    server = _listener()
    port = server.getsockname()[1]
    code = (
        "import time\n"
        "from fedprivopt.simulation.cluster_watch import HeadWatch\n"
        f"with HeadWatch('127.0.0.1:{port}', 'ray-address', interval=0.05, grace=0.3):\n"
        "    print('joined', flush=True)\n"
        "    time.sleep(120)\n"
        "print('not ended')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout.readline() == "joined\n"
        server.close()  # the head is gone
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"fedprivopt: error: ray-address: the Ray cluster's head at "
                               f"127.0.0.1:{port} stopped answering during the run")  # fmt: skip
    assert "resume the run (--resume)" in lines[0]


def _until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the watch made no such check"
        time.sleep(0.01)


def test_3_a_head_that_comes_back_within_the_grace_changes_nothing():
    server = _listener()
    host, port = server.getsockname()
    lost: list[str] = []
    watch = HeadWatch(f"{host}:{port}", "ray-address", interval=0.02, grace=30.0,
                      on_lost=lost.append)  # fmt: skip
    seen: list[bool] = []
    answers = watch._answers
    watch._answers = lambda: seen.append(answers()) or seen[-1]
    with watch:
        _until(lambda: seen.count(True) >= 1)
        server.close()
        _until(lambda: seen[-3:] == [False] * 3)  # the head is gone for several checks
        server = socket.create_server((host, port))  # Ray's GCS fault tolerance restarts it
        _until(lambda: seen[-1])
    server.close()
    assert lost == [] and not watch._thread.is_alive()


def _same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.mark.parametrize("strategy", ["dp-fedadam", "dp-fedavg-adadp"])
def test_4_a_state_refused_at_its_accountant_leaves_the_algorithm_as_it_was(strategy):
    """A state whose round and model are valid but whose accountant is not.

    ``load_state_dict`` set the round and the model (and the optimizer's moments) before the
    accountant refused the state: the algorithm stayed at the state's round 2 and model with
    its own round-0 accountant, and a caller who caught the ``ValueError`` and went on trained
    from that mixture (its next round numbered 3, its ε that of one round). Now a refused state
    leaves the algorithm as it was.
    """
    config = StrategyConfig.from_mapping({"strategy": strategy, "population": 40,
        "clients-per-round": 8, "noise-multiplier": 1.0, "clip-norm": 1.0, "seed": 3})  # fmt: skip
    ran = build_algorithm(config, torch.zeros(6))
    for r in (1, 2):
        drive_round(ran, r, lambda req: {u: torch.full((6,), 0.1 * u) for u in req.users})
    state = ran.state_dict()
    state["accountant"] = {**state["accountant"], "version": 99}
    fresh = build_algorithm(config, torch.zeros(6))
    before = fresh.state_dict()
    with pytest.raises(ValueError, match="version"):
        fresh.load_state_dict(state)
    assert fresh.round_num == 0 and torch.equal(fresh.params, torch.zeros(6))
    after = fresh.state_dict()
    moments = (after["opt_state"] or {}).items()
    assert all(_same(v, before["opt_state"][k]) for k, v in moments)
    assert after["accountant"] == before["accountant"]
    fresh.load_state_dict(ran.state_dict())  # a valid state is taken whole
    assert fresh.round_num == 2 and torch.equal(fresh.params, ran.params)


def test_5_a_tunings_plot_ignores_an_invalid_mplbackend(tmp_path, monkeypatch):
    """``MPLBACKEND=bogus fedprivopt tune toy.toml --grid server-learning-rate=0.5,1 …``.

    Found by the outputs reviewer after its finding 2 (a comparison's plots): ran the trials,
    then rc 2 with matplotlib's ``Key backend: 'bogus' is not a valid value …`` and no
    ``report.md`` (``tune_report`` imported matplotlib itself). It now imports it through
    ``report_plots.import_matplotlib`` as the comparison's plots do.
    """
    summary = {"metric": "eval_accuracy", "mode": "max", "strategy": "dp-fedavg",
               "epsilon": 12.0, "epsilon_single_run": 10.0,
               "trials": [{"trial": "trial-000", "eval_accuracy": 0.5},
                          {"trial": "trial-001", "eval_accuracy": float("nan")}]}  # fmt: skip
    summary["best"] = summary["trials"][0]
    loaded = {m: sys.modules[m] for m in list(sys.modules) if m.split(".")[0] == "matplotlib"}
    monkeypatch.setenv("MPLBACKEND", "bogus")
    for name in loaded:  # as in a process that has not imported matplotlib yet
        del sys.modules[name]
    try:
        tune_report._plot(tmp_path / "trials.png", summary)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"]:
            del sys.modules[name]
        sys.modules.update(loaded)
    assert (tmp_path / "trials.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_6_a_report_header_counts_the_runs_of_groups_whose_seeds_differ():
    """``compare toy.toml --strategies dp-fedavg,dp-fedadam --tune-grid … --rounds 1``.

    The tuning reviewer's report: a tuned comparison's header said "2 strategies × 1 noise
    multipliers × 2 seeds (1356721935, 2138214908)", 2 runs read as 4: each group holds one
    released trial with its own run seed. Now "1 run per group (seeds differ between groups:
    …)"; groups with the same seeds read as before.
    """
    tuned = [{"seeds": [1356721935]}, {"seeds": [2138214908]}]
    assert report_markdown._seeds_text(tuned, [1356721935, 2138214908]) == (
        "1 run per group (seeds differ between groups: 1356721935, 2138214908)"
    )
    short = [{"seeds": [0, 1, 2]}, {"seeds": [0, 2]}]  # a cell missing from one group
    assert report_markdown._seeds_text(short, [0, 1, 2]).startswith("2–3 runs per group")
    same = [{"seeds": [0, 1, 2]}, {"seeds": [2, 1, 0]}]
    assert report_markdown._seeds_text(same, [0, 1, 2]) == "3 seeds (0, 1, 2)"


class EvaluateExits(OwnTask):
    """The tasks reviewer's minimal task whose ``evaluate`` calls ``sys.exit(0)``."""

    def evaluate(self, model):
        sys.exit(0)


def test_7_a_task_whose_evaluate_exits_is_one_line(tmp_path, capsys):
    """The tasks reviewer's report: ``sys.exit(0)`` in a task's ``evaluate()``.

    ``simulate`` ended with rc 0 and no line after the first round's release (a run half done
    passing for a success). Now rc 2 and one line naming the member; the released round is in
    the ledger.
    """
    out = tmp_path / "run"
    rc = main(["simulate", str(TOY), "--rounds", "2", "--quiet", "--out", str(out),
               "--set", f"task={__name__}:EvaluateExits", "--set", "population=6",
               "--set", "clients-per-round=4", "--set", "task-params={num-users=6}"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "EvaluateExits.evaluate() must return; it called sys.exit(0)" in err[0]


def test_8_deploy_local_notes_the_keys_its_strategy_does_not_use(tmp_path, monkeypatch):
    """The deploy reviewer's finding 4 (its fix needed ``note_unused`` public).

    ``deploy local toy.toml --set tau=0.1 --set side-information.kind=public-users`` (dp-fedavg
    uses neither) deployed without a word where ``simulate`` says ``note: dp-fedavg does not
    use side-information, tau (…)``. Now ``deploy local`` says it too, before anything starts
    (the deployment itself is replaced by a failure here).
    """

    def refuse(**kwargs):
        raise RuntimeError("not started (test)")

    monkeypatch.setattr(deploy_module, "deploy_local", refuse)
    args = ["deploy", "local", "--nodes", "1", "--insecure", str(TOY), "--rounds", "1",
            "--out", str(tmp_path / "d"), "--quiet", "--set", "population=6",
            "--set", "task-params.num-users=6", "--set", "clients-per-round=3",
            "--set", "tau=0.1", "--set", "side-information.kind=ones"]  # fmt: skip
    code, _, err = run_cli(args)
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert code == 1 and "not started (test)" in err
    assert notes == [
        "note: dp-fedavg does not use side-information, tau (other strategies' options, or "
        "ones it ignores)"
    ]


def test_9_a_client_app_sends_updates_in_the_dtype_of_the_messages_model():
    """The tasks reviewer's report: a float64 model on the Flower engine never trained.

    ``clients.reply_updates`` sent every update as float32 and the server, which sums in the
    model's dtype, rejected them all (``dtype torch.float32 != torch.float64``): noise-only
    rounds, ``eval_accuracy`` 0.435 where the fast engine trains to 0.775. Now every update goes
    in the dtype of the message's model as one flat vector: float64 for a float64 model (also a
    float32 vector), float32 otherwise (also a float64 vector, as before).
    """
    from flwr.app import Array, ArrayRecord

    from fedprivopt import wire as P
    from fedprivopt.clients import reply_updates
    from tests.messages import delivered
    from tests.reliability.test_thirtyfirst_review_processes import _config_record

    # four entries: the model "w" (3) and "n" (1) as one flat vector (forty-first review, wire 1)
    vectors = {1: torch.ones(4, dtype=torch.float64), 2: torch.ones(4), 3: torch.ones(4).half()}
    for model, want in ((np.float64, np.float64), (np.float32, np.float32)):
        arrays = ArrayRecord({"w": Array(np.ones(3, dtype=model)), "n": Array(np.ones(1, "i8"))})
        config = _config_record(users=[1, 2, 3])  # users asked (forty-first review, wire 1)
        message = delivered({P.ARRAYS_RECORD: arrays, P.CONFIG_RECORD: config}, "train")
        reply = reply_updates(message, vectors)
        sent = {u: reply.content[P.update_key(u)][P.DELTA_ARRAY].numpy().dtype for u in vectors}
        assert sent == dict.fromkeys(vectors, want)


def test_10_a_redo_refused_after_vectorize_changed_says_it_may_be_why(tmp_path, capsys):
    """The engines reviewer's report A (``RunLedger._replayed``).

    ``simulate stackoverflow-tp-mini.toml --rounds 3 --out R``, ``rm R/checkpoint.pt`` (a kill
    past a checkpoint), ``vectorize = false`` in ``R/config.toml``, ``--resume R``: the redone
    round 3 is refused, rightly (the vectorized trainer and ``LocalTrainer`` differ in float
    rounding), but the line named "another device or edited code", not the engine or
    ``vectorize``, the one thing changed. Now it names them among the causes.
    """
    out = tmp_path / "run"
    preset = TOY.parent / "stackoverflow-tp-mini.toml"
    assert main(["simulate", str(preset), "--rounds", "3", "--quiet", "--out", str(out)]) == 0
    (out / "checkpoint.pt").unlink()
    config = (out / "config.toml").read_text()
    assert "vectorize = true" in config
    (out / "config.toml").write_text(config.replace("vectorize = true", "vectorize = false"))
    capsys.readouterr()
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "round 3, redone from the checkpoint" in err[0]
    assert "another engine, vectorize or (on a GPU) cohort-chunk or fast-actors setting" in err[0]


def lenient_task(num_users: int = 6, **ignored):
    """A factory taking any task parameter (``**params``), as a user's may."""
    return OwnTask(num_users=num_users)


@pytest.mark.parametrize("value", ["1979-05-27", "[07:32:00]", "1979-05-27T07:32:00Z"])
def test_11_a_toml_date_as_a_setting_is_one_line(tmp_path, capsys, value):
    """The tasks reviewer's report: ``--set task-params.extra=1979-05-27``.

    For a factory that takes ``**params`` (``lenient_task`` here) the run ended in
    ``TypeError: Object of type date is not JSON serializable`` (rc 1) where the run's settings
    are recorded. Now any key whose value is a TOML date or time (also in an array) is one
    line, rc 2, before anything is written.
    """
    out = tmp_path / "run"
    rc = main(["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
               "--set", f"task={__name__}:lenient_task",
               "--set", "population=6", "--set", "clients-per-round=4", "--set",
               "task-params={num-users=6}", "--set", f"task-params.extra={value}"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "task-params.extra: a TOML date or time is no setting" in err[0]
    assert not out.exists()


class ModelOf(OwnTask):
    """The minimal task whose ``build_model`` is as ``kind`` says."""

    def __init__(self, *, kind: str, **params) -> None:
        super().__init__(**params)
        self.kind = kind

    def build_model(self):
        if self.kind == "exit":
            sys.exit(0)
        if self.kind == "lazy":
            return torch.nn.LazyLinear(2)
        return torch.nn.Linear(4, 2, device="meta")


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("exit", "ModelOf.build_model() must return; it called sys.exit(0)"),
        ("lazy", "'weight' is uninitialized (a lazy module"),
        ("meta", "'weight' is on device meta (build the model on the CPU)"),
    ],
)
def test_12_a_model_that_cannot_start_a_run_is_one_line(tmp_path, capsys, kind, said):
    """The tasks reviewer's report: ``build_model()`` exiting, lazy or on the meta device.

    Before: rc 0 and no line (``sys.exit(0)``), or a traceback, rc 1 (``Can't access the shape
    of an uninitialized parameter``; ``Tensor.item() cannot be called on meta tensors``). Now
    one line, rc 2, before anything is written (``run._initial_model``).
    """
    out = tmp_path / "run"
    rc = main(["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
               "--set", f"task={__name__}:ModelOf", "--set", "population=6",
               "--set", "clients-per-round=4", "--set",
               f'task-params={{num-users=6, kind="{kind}"}}'])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert said in err[0]
    assert not out.exists()


def test_13_a_setting_that_does_not_fit_the_private_population_says_which_population(
    tmp_path, capsys
):
    """The optim reviewer's note (thirty-third review): AdaDPS' public users and min-shares.

    ``simulate toy.toml --set strategy=adadps --set side-information.kind=public-users --set
    side-information.users=30 --set noise-mode=distributed --set min-shares=20`` (population 40)
    said ``min-shares must be in [0, population = 10]``. Now the line says that population is
    the private one, 40 users less the 30 public ones.
    """
    rc = main(["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(tmp_path / "r"),
               *_sets("strategy=adadps", "side-information.kind=public-users",
                      "side-information.users=30", "noise-mode=distributed",
                      "min-shares=20")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "min-shares must be in [0, population = 10]" in err[0]
    assert "(population here is the private population: 40 users less the 30 public" in err[0]
