"""Issue 15, twenty-third hostile review: regression tests of its findings.

1. ``simulate toy.toml --set engine=flower --set ray-address="head..lan:6379"`` (a doubled dot,
   or a host label over 63 characters; also through ``RAY_ADDRESS``, ``compare`` and ``tune``)
   passed the address check and ended in ``error: encoding with 'idna' codec failed
   (UnicodeError: label empty or too long)``: rc 2 and one line, but naming neither
   ``ray-address`` nor the address. Now the check refuses a host name whose labels are not 1 to
   63 characters (or which is longer than 253), naming the key, before anything is written.
2. A task by reference (``task = "mytask:Task"``) whose ``evaluate`` returned ``{"accuracy":
   "high"}`` or ``None`` ended in ``error: could not convert string to float: 'high'`` (rc 2,
   naming neither the task nor the metric), and one returning a list in an ``AttributeError``
   traceback (rc 1). Now ``task 'mytask:Task': evaluate() returned 'high' for the metric
   'accuracy', not a number`` (or ``returned 'list', not a mapping ...``).
3. ``tune toy.toml --grid server-learning-rate=1.0,1`` (also ``compare --tune-grid``) was accepted
   with the grid ``[1.0, 1]``, one configuration drawn twice as often as the others, where
   ``5e-1,0.5`` and ``compare --noise-multipliers 1,1.0`` were refused as given twice: the
   check compared the values' types, and ``int`` is not ``float``. Now ``argument --grid:
   'server-learning-rate' lists '1' twice`` (``true`` and ``1`` stay distinct).
4. A task by reference whose optional members return the wrong thing: ``data_identity()`` a
   list, or a mapping holding a set; ``primary_metric = 5``; ``private_evaluation_users()`` a
   list (``tune``): a ``TypeError`` traceback with rc 1 (the messages were good, but the command
   line says only ``ValueError``s in one line); ``reference()`` a string: ``error: too many
   values to unpack (expected 2)`` after the run's last round. Now ``models.task.TaskError``
   (a ``TypeError`` and a ``ValueError``): rc 2, one line naming the member.
4b. The same for ``initialization = object()`` (a ``TypeError`` traceback from ``summary.json``'s
   JSON after the last round) and a ``cohort_trainer()`` returning a string (an
   ``AttributeError`` traceback in round 1): now refused before round 1, naming the member.
5. ``simulate toy.toml --set adaptive-clipping=true --set clip-count-stddev=1e155`` (any value
   from about 1.4e154) ended in an ``OverflowError`` traceback (rc 1) in round 1 (``σ_b²``);
   from ``5e99`` to there the run ended rc 0, but its ledger's count noise multiplier ``2σ_b``
   was above what an accountant state holds (1e100), so ``--resume`` was refused for ever as
   ``the privacy ledger is damaged or was edited``. Now the key is at most 5e99: rc 2, one line,
   before anything is written; a run at 5e99 resumes.
6. A tree run's (``noise-mechanism = "tree"``) checkpoints whose participation state lost its
   ``users``, or had it set to ``None`` or a string, with the digest recomputed by the project's
   own ``state_digest``: ``simulate --resume`` ended in a ``KeyError`` or ``TypeError``
   traceback (rc 1). ``ParticipationLedger.load_state_dict`` now checks the state's fields (a
   1-D integer tensor of users): rc 2, ``R/checkpoint.pt: participation state: ...; refusing to
   resume``.
7. The same kind of forgery of the rest of the algorithm state (every leaf of dp-fedadam,
   dp-fedavg-adadp, dp2 and tree checkpoints deleted, ``None``, a string, or -1 / cut to 3
   entries; 132 forgeries): ``round``, ``params`` or ``user_offset`` ``None`` or a string, and
   the tree's ``nodes`` ``None`` raised ``TypeError``/``AttributeError`` out of ``--resume``
   (rc 1); an optimizer count of -1 (Adam ``count``, ADADP ``accepted``) a
   ``ZeroDivisionError`` in the first resumed round, and an Adam ``nu`` or DP2
   ``second_moment`` of 3 entries a size-mismatch ``RuntimeError``; an ADADP learning rate of -1
   and a DP2 ``phase_step`` of -1 ran (rc 0). Now ``ServerAlgorithm.load_state_dict`` checks
   the round, the parameters' shape and dtype, the offset and the optimizer moments' shapes,
   ``optim.base.state_from_dict`` refuses negative counts and scalars, and
   ``TreeNoise.load_state_dict`` its nodes' form: rc 2, one line each.
8. ``tune`` of a task whose ``evaluate()`` returns a string (finding 2's task; no ``--metric``):
   every trial failed at its first evaluation, before its first release, and the tuning ended
   rc 0 with ``1 trials, no trial released; epsilon = 13.08 for the tuning`` (as the
   twenty-first review's unreachable cluster did). The initial evaluation that checks
   ``--metric`` now runs without it too and checks every metric is a number: rc 2, one line,
   before a trial.
9. ``compare toy.toml --strategies dp-fedavg --set strategies.dp-fedavg.tau=0.1`` ran without a
   word, where ``--set tau=0.1`` and ``simulate --set strategies.dp-fedavg.tau=0.1`` say ``note:
   dp-fedavg does not use tau``: compare's note compared the strategy's unused keys with the
   ``--set`` keys as written. Now a strategy's own table prefix is taken off first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedprivopt.models.toy import ToyClassificationTask
from tests.reliability.test_fuzz_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


def one_line_error(code: int, err: str, *parts: str) -> str:
    """rc 2, no traceback, one stderr line holding every one of ``parts``."""
    assert code == 2, err
    assert "Traceback" not in err and err.endswith("\n"), err
    assert len(err.splitlines()) == 1, err
    for part in parts:
        assert part in err, (part, err)
    return err


# -- finding 1: a host name no resolver takes ------------------------------------------------------
BAD_HOSTS = ["a..b", "head." + "x" * 64, "x" * 64, ".".join(["abcdefgh"] * 29)]


@pytest.mark.parametrize("host", BAD_HOSTS, ids=["empty-label", "long-label", "one-long", "long"])
def test_1_a_host_name_with_an_empty_or_long_label_is_refused_naming_ray_address(host):
    from fedprivopt.simulation.cluster_config import check_address

    with pytest.raises(ValueError, match="ray-address must be"):
        check_address(f"{host}:6379")


def test_1_valid_host_names_still_pass():
    from fedprivopt.simulation.cluster_config import check_address

    for address in ["head-1.lan:6379", "x" * 63 + ".y:1", "10.0.0.1:6379", "[::1]:6379", "auto"]:
        assert check_address(address) == address


def test_1_simulate_with_such_a_ray_address_names_the_key(tmp_path):
    out = tmp_path / "r"
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
            "--set", "engine=flower", "--set", 'ray-address="head..lan:6379"']  # fmt: skip
    code, _, err = run_cli(argv)
    one_line_error(code, err, "ray-address", "head..lan:6379")
    assert "idna" not in err
    assert not out.exists()


def test_1_the_same_from_ray_address_in_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "head..lan:6379")
    out = tmp_path / "r"
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
            "--set", "engine=flower"]  # fmt: skip
    code, _, err = run_cli(argv)
    one_line_error(code, err, "RAY_ADDRESS", "head..lan:6379")


# -- finding 2: a task by reference whose evaluate() returns what is not a number ----------------
class _WordMetric(ToyClassificationTask):
    """The toy task, its accuracy said in words."""

    def evaluate(self, model):
        return {"accuracy": "high", "loss": 0.5}


class _NoneMetric(ToyClassificationTask):
    def evaluate(self, model):
        return {"accuracy": None}


class _ListMetrics(ToyClassificationTask):
    def evaluate(self, model):
        return [("accuracy", 0.5)]


@pytest.mark.parametrize(
    ("factory", "said"),
    [("_WordMetric", "'high' for the metric 'accuracy'"),
     ("_NoneMetric", "None for the metric 'accuracy'"),
     ("_ListMetrics", "returned 'list'")],
)  # fmt: skip
def test_2_a_task_metric_that_is_no_number_is_named_with_the_task(tmp_path, factory, said):
    out = tmp_path / "r"
    task = f"tests.reliability.test_twentythird_review:{factory}"
    argv = ["simulate", str(TOY), "--rounds", "2", "--quiet", "--out", str(out),
            "--set", f'task="{task}"']  # fmt: skip
    code, _, err = run_cli(argv)
    one_line_error(code, err, f"task '{task}'", "evaluate()", said)
    assert not out.exists()  # the first evaluation precedes round 1's ledger line


# -- finding 3: a grid value given twice, once as an integer and once as a float ----------------
@pytest.mark.parametrize("values", ["1.0,1", "1,1.0", "2,0.5,2.0", "1e0,1"])
def test_3_a_grid_listing_one_number_as_integer_and_float_is_refused(values):
    from fedprivopt.simulation.tune_grid import parse_grid

    with pytest.raises(ValueError, match=r"argument --grid: 'server-learning-rate' lists .* twice"):
        parse_grid([f"server-learning-rate={values}"])


def test_3_values_of_other_types_stay_distinct():
    from fedprivopt.simulation.tune_grid import parse_grid

    grid = parse_grid(["server-momentum=0,0.5", "bias-correction=true,false", "tau=1,2"])
    assert grid["bias-correction"] == (True, False)
    assert grid["server-momentum"] == (0, 0.5)


def test_3_tune_with_such_a_grid_writes_nothing(tmp_path):
    out = tmp_path / "t"
    argv = ["tune", str(TOY), "--grid", "server-learning-rate=1.0,1", "--mean-trials", "1",
            "--rounds", "1", "--seed", "1", "--quiet", "--out", str(out)]  # fmt: skip
    code, _, err = run_cli(argv)
    one_line_error(code, err, "--grid", "twice")
    assert not out.exists()


# -- finding 4: a task by reference whose optional members return the wrong thing --------------
class _ListIdentity(ToyClassificationTask):
    def data_identity(self):
        return ["data.sqlite"]


class _SetIdentity(ToyClassificationTask):
    def data_identity(self):
        return {"files": {"a", "b"}}


class _IntMetricName(ToyClassificationTask):
    primary_metric = 5


class _ListEvaluationUsers(ToyClassificationTask):
    def private_evaluation_users(self):
        return [0, 10]


class _StringReference(ToyClassificationTask):
    def reference(self):
        return "prior"


def _ref(name: str) -> str:
    return f'task="tests.reliability.test_twentythird_review:{name}"'


class _ObjectInitialization(ToyClassificationTask):
    initialization = object()


class _StringCohortTrainer(ToyClassificationTask):
    def cohort_trainer(self, *, device, chunk_users):
        return "fast"


@pytest.mark.parametrize(
    ("factory", "said"),
    [("_ListIdentity", "_ListIdentity.data_identity() must return a mapping, got 'list'"),
     ("_SetIdentity", "_SetIdentity.data_identity() must return a mapping of JSON values"),
     ("_IntMetricName", "_IntMetricName.primary_metric must be a metric name, got 5"),
     # 4b: before, the summary's JSON after the last round, and round 1
     ("_ObjectInitialization", "_ObjectInitialization.initialization must be a string"),
     ("_StringCohortTrainer", "_StringCohortTrainer.cohort_trainer() must return a cohort")],
)  # fmt: skip
def test_4_simulate_refuses_such_a_task_in_one_line_before_a_round(tmp_path, factory, said):
    out = tmp_path / "r"
    argv = ["simulate", str(TOY), "--rounds", "2", "--quiet", "--out", str(out),
            "--set", _ref(factory)]  # fmt: skip
    code, _, err = run_cli(argv)
    one_line_error(code, err, said)
    assert not out.exists()


def test_4_tune_refuses_evaluation_users_that_are_no_pair(tmp_path):
    out = tmp_path / "t"
    argv = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
            "--rounds", "1", "--seed", "1", "--quiet", "--out", str(out),
            "--set", _ref("_ListEvaluationUsers")]  # fmt: skip
    code, _, err = run_cli(argv)
    one_line_error(code, err, "private_evaluation_users() must return (private, evaluated)")


def test_4_a_reference_that_is_no_pair_is_named_and_the_rounds_are_kept(tmp_path):
    out = tmp_path / "r"
    argv = ["simulate", str(TOY), "--rounds", "2", "--quiet", "--out", str(out),
            "--set", _ref("_StringReference")]  # fmt: skip
    code, _, err = run_cli(argv)
    one_line_error(code, err, "_StringReference.reference() must return (name, metrics)", "'prior'")
    assert len((out / "privacy_ledger.jsonl").read_text().splitlines()) == 3  # header, 2 rounds


def test_4_the_api_still_raises_a_type_error():
    from fedprivopt.models.task import TaskError, data_identity

    with pytest.raises(TypeError, match="must return a mapping"):
        data_identity(_ListIdentity(num_users=4))
    assert issubclass(TaskError, ValueError)


# -- finding 5: clip-count-stddev without an upper bound ----------------------------------------
@pytest.mark.parametrize("value", ["1e300", "1e155", "6e99"])
def test_5_a_count_noise_no_ledger_can_hold_is_refused_before_the_run(tmp_path, value):
    out = tmp_path / "r"
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
            "--set", "adaptive-clipping=true", "--set", f"clip-count-stddev={value}"]  # fmt: skip
    code, _, err = run_cli(argv)
    one_line_error(code, err, "clip-count-stddev", "5e+99")
    assert not out.exists()


def test_5_a_run_at_the_bound_resumes(tmp_path):
    out = tmp_path / "r"
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(out),
            "--set", "adaptive-clipping=true", "--set", "clip-count-stddev=5e99"]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err
    config = out / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 1", "num-server-rounds = 2"))
    code, _, err = run_cli(["simulate", "--resume", str(out), "--quiet"])
    assert code == 0, err


# -- finding 6: a tree run's checkpoint whose participation state lacks its users --------------
def _participation(state):
    """The dict of a checkpoint's algorithm state that holds the tree's participation ledger."""
    if isinstance(state, dict):
        if "period" in state and "users" in state:
            return state
        for value in state.values():
            found = _participation(value)
            if found is not None:
                return found
    return None


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tree") / "r"
    argv = ["simulate", str(TOY), "--rounds", "6", "--quiet", "--out", str(out),
            "--set", "noise-mechanism=tree", "--set", "tree-restart-rounds=4",
            "--set", "checkpoint-every=2"]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err
    config = out / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 6", "num-server-rounds = 8"))
    return out


@pytest.mark.parametrize("users", ["deleted", None, "abc"])
def test_6_a_forged_participation_state_is_refused_in_one_line(tmp_path, tree_run, users):
    import shutil

    import torch

    from fedprivopt.simulation.checkpoint import state_digest

    run = tmp_path / "r"
    shutil.copytree(tree_run, run)
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        state = torch.load(run / name, weights_only=False)
        part = _participation(state["algorithm"])
        assert part is not None
        if users == "deleted":
            del part["users"]
        else:
            part["users"] = users
        state["sha256"] = state_digest(state)  # the project's own digest, recomputed
        torch.save(state, run / name)
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    one_line_error(code, err, "participation state", "refusing to resume")


def test_6_the_participation_ledger_names_what_is_missing():
    from fedprivopt.privacy.tree import ParticipationLedger

    for state in ({}, None, {"period": 1}, {"period": 1, "users": "abc"}):
        with pytest.raises(ValueError, match="participation state"):
            ParticipationLedger(5).load_state_dict(state)


# -- finding 7: other fields of a checkpoint's algorithm state, forged with the digest ------------
def _forge(run: Path, path: tuple, value) -> None:
    """Set ``path`` of both checkpoints' algorithm state to ``value``, digest recomputed."""
    import torch

    from fedprivopt.simulation.checkpoint import state_digest

    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        state = torch.load(run / name, weights_only=False)
        node = state["algorithm"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value
        state["sha256"] = state_digest(state)
        torch.save(state, run / name)


def _four_rounds(tmp_path_factory, name: str, *sets: str) -> Path:
    out = tmp_path_factory.mktemp(name) / "r"
    argv = ["simulate", str(TOY), "--rounds", "4", "--quiet", "--out", str(out),
            "--set", "checkpoint-every=2"]  # fmt: skip
    for item in sets:
        argv += ["--set", item]
    code, _, err = run_cli(argv)
    assert code == 0, err
    config = out / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 4", "num-server-rounds = 6"))
    return out


@pytest.fixture(scope="module")
def runs_to_forge(tmp_path_factory):
    return {
        "adam": _four_rounds(tmp_path_factory, "adam", "strategy=dp-fedadam"),
        "adadp": _four_rounds(tmp_path_factory, "adadp", "strategy=dp-fedavg-adadp"),
        "dp2": _four_rounds(tmp_path_factory, "dp2", "strategy=dp2"),
        "tree": _four_rounds(tmp_path_factory, "tree", "noise-mechanism=tree"),
    }


FORGED = [
    ("adam", ("round",), None, "round must be an integer"),
    ("adam", ("params",), "abc", "no model parameters"),
    ("adam", ("user_offset",), None, "user_offset"),
    ("adam", ("opt_state", "count"), -1, "AdamState.count must be an int >= 0"),
    ("adam", ("opt_state", "nu"), lambda t: t[:3].clone(), "optimizer state nu has shape (3,)"),
    ("adadp", ("opt_state", "accepted"), -1, "ADADPState.accepted must be an int >= 0"),
    ("adadp", ("opt_state", "learning_rate"), -1.0, "learning_rate must be a float >= 0"),
    ("dp2", ("opt_state", "phase_step"), -1, "DP2State.phase_step must be an int >= 0"),
    ("dp2", ("opt_state", "second_moment"), lambda t: t[:3].clone(), "second_moment"),
    ("tree", ("tree", "noise", "nodes"), None, "tree state: nodes must be a list"),
]


@pytest.mark.parametrize(("run", "path", "value", "said"), FORGED, ids=lambda v: str(v)[:20])
def test_7_a_forged_algorithm_state_is_refused_in_one_line(
    tmp_path, runs_to_forge, run, path, value, said
):
    import shutil

    forged = tmp_path / "r"
    shutil.copytree(runs_to_forge[run], forged)
    _forge(forged, path, value)
    code, _, err = run_cli(["simulate", "--resume", str(forged), "--quiet"])
    one_line_error(code, err, said, "refusing to resume")


# -- finding 8: a tuning whose every trial fails at its first evaluation ------------------------
def test_8_tune_refuses_a_task_whose_metric_is_no_number_before_a_trial(tmp_path):
    out = tmp_path / "t"
    argv = ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2",
            "--rounds", "2", "--seed", "3", "--quiet", "--out", str(out),
            "--set", _ref("_WordMetric")]  # fmt: skip
    code, stdout, err = run_cli(argv)
    one_line_error(code, err, "_WordMetric", "'high' for the metric 'accuracy'")
    assert "no trial released" not in stdout
    assert not (out / "summary.json").exists()


# -- finding 9: compare's note on a strategy-table --set ----------------------------------------
def test_9_compare_notes_an_unused_key_set_through_the_strategy_table(tmp_path):
    out = tmp_path / "c"
    argv = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "1", "--quiet",
            "--out", str(out), "--set", "strategies.dp-fedavg.tau=0.1"]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err
    assert "note: dp-fedavg does not use tau" in err, err


# -- noticed by the review, fixed after it --------------------------------------------------------
def test_10_the_baselines_note_that_they_ignore_adaptive_clipping(tmp_path):
    """Before: ``--set adaptive-clipping=true`` on ``fedavg`` ran without a word (ε inf)."""
    code, _, err = run_cli(["simulate", str(TOY), "--strategy", "fedavg", "--rounds", "1",
                            "--quiet", "--out", str(tmp_path / "r"),
                            "--set", "adaptive-clipping=true"])  # fmt: skip
    assert code == 0, err
    assert "note: fedavg does not use adaptive-clipping" in err, err
    code, _, err = run_cli(["tune", str(TOY), "--strategy", "fedadam", "--mean-trials", "2",
                            "--grid", "adaptive-clipping=true,false", "--rounds", "1",
                            "--quiet", "--out", str(tmp_path / "t")])  # fmt: skip
    one_line_error(code, err, "--grid", "adaptive-clipping", "changes nothing in a run of fedadam")


@pytest.mark.parametrize("command", ["compare", "tune"])
def test_11_a_refused_comparison_or_tuning_leaves_no_directory_it_created(tmp_path, command):
    """Before: refused after creating ``--out`` (a Ray address nothing answers), ``compare`` and
    ``tune`` left their lock file and an empty ``runs/``, which ``simulate --out`` refused."""
    out = tmp_path / "new"
    argv = {
        "compare": ["compare", str(TOY), "--strategies", "dp-fedavg"],
        "tune": ["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "2"],
    }[command]
    code, _, err = run_cli([*argv, "--rounds", "1", "--quiet", "--out", str(out), "--set",
                            "engine=flower", "--set", "ray-address=127.0.0.1:1"])  # fmt: skip
    one_line_error(code, err, "127.0.0.1:1")
    assert not out.exists()


def test_11_what_a_failed_comparison_leaves_beside_its_scaffold_is_kept(tmp_path):
    from fedprivopt.simulation.rundir import removed_if_unused

    new, kept, before = tmp_path / "new", tmp_path / "kept", tmp_path / "before"
    before.mkdir()
    for out, extra in ((new, None), (kept, "notes.txt"), (before, None)):
        with pytest.raises(ValueError), removed_if_unused(out, "compare.lock"):
            (out / "runs").mkdir(parents=True, exist_ok=True)
            (out / "compare.lock").write_text("123")
            if extra:
                (out / extra).write_text("mine")
            raise ValueError("refused")
    assert not new.exists()
    assert (kept / "notes.txt").read_text() == "mine" and (kept / "runs").is_dir()
    assert (before / "runs").is_dir()  # a directory it did not create is left as it is


@pytest.mark.parametrize("command", ["simulate", "compare", "tune"])
def test_12_an_out_that_cannot_be_made_is_named_as_out(command):
    """Before: ``fedprivopt tune: error: /proc/t: No such file or directory`` (no flag)."""
    extra = {
        "simulate": [],
        "compare": ["--strategies", "dp-fedavg"],
        "tune": ["--grid", "server-learning-rate=0.5,1", "--mean-trials", "2"],
    }[command]
    code, _, err = run_cli([command, str(TOY), *extra, "--out", "/proc/t", "--quiet"])
    one_line_error(code, err, "argument --out: /proc/t: No such file or directory")


# -- noticed: a task module edited after its runs ----------------------------------------------
TASK_MODULE = """
from fedprivopt.models.toy import ToyClassificationTask

SEED = 1


class EditedTask(ToyClassificationTask):
    def __init__(self, **kw):
        kw["seed"] = SEED
        super().__init__(**kw)
"""


@pytest.fixture
def edited_task_module(tmp_path, monkeypatch):
    """A task module ``r23_edited_task`` in ``tmp_path`` (importable); yields its path."""
    import sys

    path = tmp_path / "r23_edited_task.py"
    path.write_text(TASK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    sys.modules.pop("r23_edited_task", None)


def test_13_an_edited_task_module_is_refused_by_resume_and_by_compare_s_reuse(
    tmp_path, edited_task_module
):
    """Before: ``compare`` reused the cell run on the old code (marked reused) and ``--resume``
    continued a run on other data; now both refuse, naming the module."""
    ref = ["--set", 'task="r23_edited_task:EditedTask"']
    run, cmp = tmp_path / "r", tmp_path / "c"
    code, _, err = run_cli(["simulate", str(TOY), "--rounds", "4", "--quiet", "--out", str(run),
                            "--set", "checkpoint-every=2", *ref])  # fmt: skip
    assert code == 0, err
    compare = ["compare", str(TOY), "--strategies", "dp-fedavg", "--rounds", "2", "--quiet",
               "--out", str(cmp), *ref]  # fmt: skip
    code, _, err = run_cli(compare)
    assert code == 0, err
    edited_task_module.write_text(TASK_MODULE.replace("SEED = 1", "SEED = 2"))
    code, _, err = run_cli(["simulate", "--resume", str(run), "--quiet"])
    one_line_error(code, err, "the task's code changed since the run started", "r23_edited_task")
    code, _, err = run_cli(compare)
    one_line_error(code, err, "the task's code changed", "--overwrite")
    code, _, err = run_cli([*compare, "--overwrite"])
    assert code == 0, err  # rerun on the new code


def test_13_a_ledger_from_before_the_task_code_was_recorded_is_not_refused(
    tmp_path, edited_task_module
):
    from fedprivopt.models.task import TASK_SOURCE
    from fedprivopt.simulation.ledger import RunLedger

    run = tmp_path / "r"
    code, _, err = run_cli(["simulate", str(TOY), "--rounds", "2", "--quiet", "--out", str(run),
                            "--set", 'task="r23_edited_task:EditedTask"'])  # fmt: skip
    assert code == 0, err
    ledger = RunLedger.read(run)
    recorded = ledger.header["data"]
    assert recorded[TASK_SOURCE]["module"] == "r23_edited_task"
    other = {TASK_SOURCE: {"module": "r23_edited_task", "sha256": "0" * 64}}
    with pytest.raises(ValueError, match="the task's code changed"):
        ledger.check_data(other)
    ledger.header["data"] = {k: v for k, v in recorded.items() if k != TASK_SOURCE}
    del ledger.header["records"]  # (thirty-ninth review follow-up, ledger 2) as such one held
    ledger.check_data(other)  # an older ledger: not checked for the code


# -- noticed: a factory that runs the command again; the Python API's unbounded counts ----------
def test_14_a_factory_that_builds_its_own_task_again_is_one_line(tmp_path, monkeypatch):
    """Before: ``task = "fedprivopt.cli:main"`` ran the command within itself until Python's
    recursion limit: a ``RecursionError`` traceback of 2,991 lines, rc 1. Run by ``main`` in
    this process, from the repository with the child's ``sys.argv`` (no interpreter start-up)."""
    preset = tmp_path / "p.toml"
    preset.write_text(
        'strategy = "dp-fedavg"\ntask = "fedprivopt.cli:main"\npopulation = 40\n'
        "clients-per-round = 10\nnum-server-rounds = 2\nnoise-multiplier = 0.5\n"
    )
    out = tmp_path / "r"
    argv = ["simulate", str(preset), "--out", str(out), "--quiet"]
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("sys.argv", ["fedprivopt", *argv])  # what main() reads, as in a child
    code, _, err = run_cli(argv)
    one_line_error(code, err, "task 'fedprivopt.cli:main'", "again")
    assert not out.exists()


def test_14_the_api_bounds_the_count_noise_and_the_tree_population():
    from fedprivopt.privacy.adaptive_clip import NoisyCountAggregator
    from fedprivopt.privacy.tree import ParticipationLedger

    with pytest.raises(ValueError, match="clip-count-stddev"):
        NoisyCountAggregator(count_stddev=1e300, expected_cohort_size=10)  # OverflowError before
    with pytest.raises(ValueError, match=r"population must be an integer in \[1, 100000000\]"):
        ParticipationLedger(10**12)  # an allocation RuntimeError before
    NoisyCountAggregator(count_stddev=5e99, expected_cohort_size=10)  # the largest a run takes
