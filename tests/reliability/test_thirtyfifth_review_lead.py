"""Issue 15, thirty-fifth hostile review (the lead's findings): regression tests.

1. A task by reference whose ``user_data`` raises its own exception for one user
   (``OSError("damaged file for user 3")``), ``simulate toy.toml --set task=badtask:make
   --rounds 3`` (the thirty-fourth review's open engines item): the fast engine ended in a
   40-line traceback, rc 1; ``--engine flower`` counted user 3 ``failed`` in every round it was
   sampled and ended rc 0 with a model trained without them (ε 12.17): two models from one
   configuration, silently on Flower. Now ``models.task_calls`` turns an exception of
   ``user_data`` or ``loss`` into a ``TaskError`` naming the member, the user, the exception and
   the line of the task's code that raised: both engines end after round 1 with rc 2 and
   ``fedprivopt simulate: error: Bad.user_data(3) raised OSError at badtask.py:6: damaged file
   for user 3`` (Flower adds ``(the answer of 1 of the 13 nodes asked in round 2)``: the
   ClientApp answers it with a ``TASK_ERROR`` reply). Running out of memory passes as before.
2. A task's own ``cohort_trainer`` returning updates of the wrong form (float64 updates of a
   float32 model, or one entry short; the thirty-fourth review's open tasks item): every update
   was rejected for its form, and the fast engine released noise-only rounds, charged, to rc 0,
   saying so only in ``metrics.jsonl`` (``rejected``). On the fast engine every update comes from
   the run's own trainer, so now such a round is refused before its noised mean is used:
   rc 2, ``round 1: the run's own trainer gave user 0 an update of the wrong form (dtype
   torch.float64 != torch.float32; 9 of the round's updates so): ...``, nothing released. A NaN
   update (a user's training diverged) is still rejected and counted.
3. The same task raising ``MemoryError`` in round 2 (a user's data larger than the machine's
   memory): a traceback, rc 1. Now one line, ``fedprivopt simulate: error: this machine ran out
   of memory; nothing already written is lost (FEDPRIVOPT_DEBUG=1 shows where)``, rc 1, and
   round 1 stays released in the ledger (``--resume`` goes on from it).
4. (The models reviewer's findings 4 and 5, wired here.) ``dp-fedavg-adadp`` and ``dp2`` on a
   model holding frozen entries (whose noise the server drops since the thirty-fourth review):
   ADADP's noise-calibrated tolerance counted them (16.77 against 0.31 without them, every round
   accepted and the rate grown from 1.0 to 5.56 by round 19), and DP2's ``mean(P)`` (its scaled
   step, its round metric) took their ``P = ε`` in (0.00011 against 0.0195: a step 177 times
   too large, ``eval_loss`` 0.86 to 78.5). The algorithms now pass the model's frozen mask to
   ``optim``: the same tolerance and mean as the model without those entries.
5. (Found by the data and lifecycle reviewers, while the lead's edit for 4 was half done.) A
   ``TypeError`` "unexpected keyword argument 'frozen'" raised by the code building the server
   algorithm (a bug) made ``simulate toy.toml`` say ``config: unknown key 'task-params.frozen':
   not a parameter of the task``, blaming the user's config. Only an error raised while the task
   is built is read as a task parameter's now; a bug's stays the bug's (a traceback).
6. (The models reviewer's report on ``strategies/state.py``.) A checkpoint (digest recomputed)
   whose optimizer state is float64 throughout beside a float32 model was refused only at the
   first round, by ``delta_tilde must have dtype torch.float64 (that of the state), got
   torch.float32``, naming neither file nor state; one whose ``AdamState.count`` was set to 0
   at round 2 resumed with rc 0, restarting Adam's bias correction (eval loss 0.904 and 0.839
   where the run had 0.936 and 0.878). ``load_state_dict`` now refuses both, naming the field:
   every tensor of the state in the model's dtype, and one update a released round (``count``;
   ADADP's accepted + rejected).
7. (Found by the lifecycle reviewer.) ``--set 'task-params={seed=1}' --set
   'task-params={num-users=40}'`` was refused as contradicting (rc 2), though the two tables set
   different keys, as ``--set task-params.seed=1 --set task-params.num-users=40`` do. Tables of
   one key are merged now; a key both set differently is still refused.
8. (Found by the lifecycle reviewer.) ``device = "cuda"`` written into a run's ``config.toml``
   on a machine without CUDA, then ``--resume``: one line, ``device must be auto or cpu on this
   machine ...``, naming neither the file nor ``--resume``. It now leads with the file.
9. (The data reviewer's report on ``models/tag_prediction_data.py``.) A tag task with
   ``token-cache = true`` whose dataset was replaced (``data synth --overwrite``) after the task
   was built and before its token store was first used built the store from the split opened
   before, under the new file's key, for later runs on the new file to reuse. The store's key
   now refuses a file other than the one the task read, as the data reviewer's finding 4 does
   where the file is reopened.
10. (The lifecycle reviewer's report on ``simulation/audit.py``.) ``simulate toy.toml --rounds
    10 --set eval-every=3`` stopped after round 5's checkpoint (only round 3 has a row), its
    ``num-server-rounds`` set to 5, then ``--resume``: rc 2, ``metrics.jsonl holds no row of
    round 5 ...: it was removed``; nothing was removed (round 5 was never evaluated) and the run
    could not be finished. A row of the checkpoint's round is demanded now only where the
    checkpoint was written after one (its row count above the distinct rounds before it); the
    resume evaluates round 5 and ends rc 0.
11. (The outputs reviewer's report on ``simulation/tune_report.py``.) ``tune toy.toml --grid
    server-learning-rate=0.5,1 --mean-trials 1 --rounds 1`` of a task whose metric is named
    ``cost_$_per_$_user``: the trials ran, then rc 2 with matplotlib's mathtext parse error and
    no ``report.md`` (``trials.png``'s axis label); one named ``p(y|x)`` broke the trials table
    (an extra cell). Both are written as the comparison's plots and tables write them now.
12. (The tuning reviewer's report on ``cli_compare_tune.py``.) ``compare toy.toml --strategies
    dp-fedavg --tune-grid server-learning-rate=0.5,1 --selection-on-private-users`` of a task
    whose evaluation users include private ones: rc 0, and ``report.md`` never said that the
    selection, which read those users' data without noise, is not covered by ε (``tune``'s and
    ``compare-tuned``'s reports say it). Its notes now list each such tuning, as
    ``compare-tuned``'s do.
13. (The thirty-sixth review's ledger reviewer's report on ``simulation/rundata.py``.) A
    finished 5-round run whose ledger was cut to its first round and whose rows' and summary's
    ε were lowered to round 1's: a report of the files as they are
    (``write_report(out, load_runs(R))``) said ε 7.55 without a note, while its checkpoint's
    accountant held the 5 rounds released (15.03); the threat model says a report never shows
    less than the largest ε any of the run's files states. The checkpoint's accountant is one
    of those files now: 15.03, with the note naming each file's ε.
14. (The thirty-sixth review's docs reviewer's report on ``cli_args.py``.) ``simulate toy.toml
    --set ray-address=auto --set fast-actors=1`` without a Ray cluster: the one line was cut
    from one apostrophe to the next 165 characters on (``… the head' (165 characters)s
    host:port``), as if it were a quoted value. A quote now opens a value only where no letter
    precedes it and closes one only where none follows; long quoted values are still cut.
15. (The thirty-sixth review's tasks and docs reviewers' reports.) A task whose
    ``build_model()``, ``evaluate()``, ``reference()`` or ``cohort_trainer()`` raises its own
    exception (a weights file gone), or a task factory that does, ended in a 29-38-line
    traceback, rc 1 (``reference()``'s after the last round, with no ``summary.json``). Each is
    one line now naming the member and the line of the task's code, rc 2, as ``user_data`` and
    ``loss`` (finding 1).
16. (The thirty-sixth review's tasks reviewer's open case.) A task whose ``evaluate()``
    registers a buffer on the model it is given: the run ended at its second evaluation in
    ``Missing key(s) in state_dict: "zz"``, a traceback, rc 1 (the evaluation model is built
    once and loaded every evaluation). It is set back to its ``build_model()`` state before
    every evaluation now, as the trainer's model is before every user: rc 0.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict

from fedprivopt import optim
from fedprivopt import wire as P
from fedprivopt.cli import main
from fedprivopt.cli_args import one_line
from fedprivopt.cli_task_errors import task_param_error
from fedprivopt.clients import LocalConfig
from fedprivopt.clients.client_app import clear_cache, get_task_and_trainer, make_client_app
from fedprivopt.clients.messages import TASK_ERROR
from fedprivopt.models.task import TaskError
from fedprivopt.models.task_calls import minibatch_loss, user_examples
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.privacy.flat import flatten
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.fast import make_cohort_train
from fedprivopt.simulation.run import build_run
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.messages import delivered
from tests.models.minimal_task import MinimalTask
from tests.reliability.test_thirtysecond_review_contract import _Task as ContractTask
from tests.reliability.test_thirtysecond_review_contract import _Trainer as ContractTrainer

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
HERE = Path(__file__).name


# -- finding 1: a task member's own exception --------------------------------------------------


class DamagedUser(MinimalTask):
    """The minimal task whose data file of user 1 is damaged."""

    def user_data(self, user_id: int):
        if user_id == 1:
            raise OSError("damaged file\nfor user 1")
        return super().user_data(user_id)


class WrongLoss(MinimalTask):
    """The minimal task whose loss hands torch a target of the wrong dtype."""

    def loss(self, model, x, y):
        return torch.nn.functional.cross_entropy(model(x), y.float()[:, None])


class NoMemory(MinimalTask):
    """The minimal task whose data outgrows the memory after the first round (2 users)."""

    calls = 0

    def user_data(self, user_id: int):
        type(self).calls += 1
        if type(self).calls > 2:
            raise MemoryError
        return super().user_data(user_id)


def test_1_a_members_exception_is_the_tasks_error_naming_the_line_of_its_code():
    with pytest.raises(TaskError) as caught:
        user_examples(DamagedUser(), 1)
    line = DamagedUser.user_data.__code__.co_firstlineno + 2
    assert str(caught.value) == (
        f"DamagedUser.user_data(1) raised OSError at {HERE}:{line}: damaged file for user 1"
    )
    task = WrongLoss()
    x, y = task.user_data(0)
    with pytest.raises(TaskError, match=rf"^WrongLoss\.loss\(\) raised \w+Error at {HERE}:\d+: "):
        minibatch_loss(task, task.build_model(), x, y)  # torch's frame is not named
    NoMemory.calls = 2
    with pytest.raises(MemoryError):  # the machine's, not the task's
        user_examples(NoMemory(), 0)


def test_1_the_fast_engine_ends_in_one_line_and_keeps_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["simulate", str(TOY), "--rounds", "2", "--out", str(out), "--quiet",
            "--set", f"task={__name__}:DamagedUser", "--set", "population=2",
            "--set", "clients-per-round=2", "--set", "task-params.num-users=2"]  # fmt: skip
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]  # before: rc 1, a traceback
    assert err.strip() == (
        "fedprivopt simulate: error: DamagedUser.user_data(1) raised OSError at "
        f"{HERE}:{DamagedUser.user_data.__code__.co_firstlineno + 2}: damaged file for user 1"
    )
    assert not out.exists()  # nothing released, nothing left


def test_1_the_client_app_answers_it_with_the_tasks_error():
    """On Flower's engine the strategy stops at a ``TASK_ERROR`` reply (thirty-third review, 7)."""
    clear_cache()
    ref, params = f"{__name__}:DamagedUser", {"num_users": 2}
    run_config = {P.RUN_TASK: ref, P.RUN_TASK_PARAMS_JSON: json.dumps(params), P.RUN_DEVICE: "cpu"}
    context = Context(
        run_id=1, node_id=11, node_config={P.NODE_PARTITION_ID: 0, P.NODE_NUM_PARTITIONS: 1},
        state=RecordDict(), run_config=run_config,
    )  # fmt: skip
    task, _ = get_task_and_trainer(ref, params, "cpu")
    settings = P.ClientSettings(
        local=LocalConfig(learning_rate=0.5, epochs=1, batch_size=4, clip_norm=1.0), seed=5
    )
    # user 1 alone: since the forty-seventh review (egress 5) a node with another user that
    # trained (user 0) leaves user 1 out of its reply instead
    config = P.encode_train_config(users=[1], round_num=1, settings=settings, stream="train")
    arrays = flat_to_arrays(*flatten(task.build_model().state_dict()))
    reply = make_client_app()(
        delivered({P.ARRAYS_RECORD: arrays, P.CONFIG_RECORD: config}, "train"), context
    )
    assert reply.has_error() and reply.error.code == TASK_ERROR  # before: Flower's exception code
    # the member and the exception's type, not its text (forty-sixth review follow-up, privacy 1)
    said = "DamagedUser.user_data raised OSError; the full message is in the node's log"
    assert reply.error.reason == said, reply
    clear_cache()


# -- finding 2: the fast engine's own trainer sending updates of the wrong form ---------------


class _FormTrainer(ContractTrainer):
    def _batch(self, users, params, kwargs):
        batch = super()._batch(users, params, kwargs)
        if self.bug == "dtype":
            return type(batch)(batch.users, batch.deltas.double(), batch.norms)
        if self.bug == "short":
            return type(batch)(batch.users, batch.deltas[:, :-1], batch.norms)
        if self.bug == "nan":
            batch.deltas[0, 0] = float("nan")
        return batch


class FormTask(ContractTask):
    def cohort_trainer(self, *, device: str, chunk_users: int) -> _FormTrainer:
        return _FormTrainer(self, self.bug)


def _round(bug: str):
    overrides = {"num-server-rounds": 1, "task": f"{__name__}:FormTask", "task-params.bug": bug}
    task, alg = build_run(load_config(TOY, overrides))
    return alg, make_cohort_train(task, device="cpu", vectorize=True)


@pytest.mark.parametrize(("bug", "why"), [("dtype", "dtype torch.float64"), ("short", "shape")])
def test_2_a_round_of_malformed_updates_from_the_runs_own_trainer_is_not_released(bug, why):
    alg, train = _round(bug)
    before = alg.params.clone()
    with pytest.raises(ValueError, match=rf"^round 1: the run's own trainer gave user \d+ an "
                       rf"update of the wrong form \({why}"):  # fmt: skip
        drive_round(alg, 1, train)  # before: every update rejected, a noise-only round released
    assert alg.round_num == 0 and alg.accountant.state_dict()["ledger"] == []
    assert torch.equal(alg.params, before)


def test_2_a_nan_update_is_rejected_and_counted_as_before():
    alg, train = _round("nan")
    result = drive_round(alg, 1, train)
    assert result.metrics["rejected"] == 1.0 and list(result.rejected.values()) == [
        "contains NaN or Inf"
    ]
    assert result.metrics["accepted"] == result.metrics["cohort_size"] - 1 > 0


def test_2_simulate_refuses_it_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", str(TOY), "--rounds", "2", "--out", str(out), "--quiet",
               "--set", f"task={__name__}:FormTask", "--set", "task-params.bug=dtype"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err  # before: rc 0, two noise-only rounds
    assert "the run's own trainer gave user" in err[0] and "wrong form" in err[0]
    assert not out.exists()


# -- finding 3: out of memory ------------------------------------------------------------------


def test_3_out_of_memory_is_one_line_and_keeps_the_released_rounds(tmp_path, capsys):
    NoMemory.calls = 0
    out = tmp_path / "run"
    code = main(["simulate", str(TOY), "--rounds", "3", "--out", str(out), "--quiet",
                 "--set", f"task={__name__}:NoMemory", "--set", "population=2",
                 "--set", "clients-per-round=2", "--set", "task-params.num-users=2"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and err == (  # before: a traceback
        "fedprivopt simulate: error: this machine ran out of memory; nothing already written is "
        "lost (FEDPRIVOPT_DEBUG=1 shows where)\n"
    )
    ledger = (out / "privacy_ledger.jsonl").read_text().splitlines()
    assert [json.loads(line).get("round") for line in ledger[1:]] == [1], ledger


# -- finding 4: ADADP's and DP2's frozen coordinates ------------------------------------------


def _algorithm(strategy: str, dim: int, frozen=None, **options):
    config = StrategyConfig.from_mapping({
        "strategy": strategy, "population": 40, "clients-per-round": 10,
        "noise-multiplier": 0.5, "num-server-rounds": 5, **options,
    })  # fmt: skip
    return build_algorithm(config, torch.zeros(dim), frozen=frozen)


def test_4_adadps_tolerance_leaves_the_frozen_coordinates_out():
    frozen = torch.zeros(1033, dtype=torch.bool)
    frozen[33:] = True
    point = torch.randn(1033, generator=torch.Generator().manual_seed(4)) * 3.0
    masked = _algorithm("dp-fedavg-adadp", 1033, frozen)
    alone = _algorithm("dp-fedavg-adadp", 33)
    got = masked.round_tolerance(0.05, 0.07, point)
    assert got == pytest.approx(alone.round_tolerance(0.05, 0.07, point[:33]))  # before: 5.6x
    assert masked.controller.tolerance == pytest.approx(alone.controller.tolerance)


def test_4_dp2s_preconditioner_mean_leaves_the_frozen_coordinates_out():
    frozen = torch.zeros(10, dtype=torch.bool)
    frozen[2:] = True
    options = {"dp2-s1": 1, "dp2-s2": 1, "dp2-epsilon": 1e-4, "dp2-beta": 0.0,
               "dp2-scale-by-preconditioner": True}  # fmt: skip
    alg = _algorithm("dp2", 10, frozen, **options)
    delta = torch.zeros(10)
    delta[:2] = torch.tensor([0.3, -0.4])
    _, alg.opt_state = alg.transform.update(delta, alg.opt_state, noise_variance=0.01)
    assert optim.phase(alg.opt_state) == "adaptive"
    mean = alg.round_metrics()["dp2_preconditioner_mean"]
    assert mean == pytest.approx(0.35 + 1e-4, rel=1e-5)  # before: 0.0701 (8 entries at 1e-4)
    step, _ = alg.transform.update(delta, alg.opt_state, noise_variance=0.01)
    assert torch.allclose(step, delta * (alg.config.options.dp2_learning_rate / mean))


# -- finding 5: a keyword error of the code is not the task's ---------------------------------


def test_5_a_keyword_error_outside_the_task_is_not_blamed_on_the_config(tmp_path, monkeypatch):
    def momentum_sgd(**kwargs):
        raise TypeError("momentum_sgd() got an unexpected keyword argument 'frozen'")

    try:
        momentum_sgd()
    except TypeError as exc:
        assert task_param_error(exc) is None  # before: "unknown key 'task-params.frozen': ..."
    monkeypatch.setattr(optim, "momentum_sgd", momentum_sgd)
    with pytest.raises(TypeError, match="momentum_sgd"):  # a bug: its traceback, not rc 2
        main(["simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet"])


def test_5_an_unknown_task_parameter_is_still_named(tmp_path, capsys):
    code = main(["simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet",
                 "--set", "task-params.frozen=1"])  # fmt: skip
    assert code == 2
    assert "unknown key 'task-params.frozen': not a parameter" in capsys.readouterr().err


# -- finding 6: an optimizer state of another dtype, or of another number of updates ---------


@pytest.fixture(scope="module")
def two_rounds():
    """``{strategy: (algorithm, its state after two rounds)}`` on the toy task."""
    out = {}
    for strategy in ("dp-fedadam", "dp-fedavg-adadp"):
        overrides = {"num-server-rounds": 2, "strategy": strategy}
        task, alg = build_run(load_config(TOY, overrides))
        train = make_cohort_train(task, device="cpu", vectorize=True)
        for r in (1, 2):
            drive_round(alg, r, train)
        out[strategy] = (alg, alg.state_dict())
    return out


def _forged(state, **opt):
    forged = dict(state)
    forged["opt_state"] = {**state["opt_state"], **opt}
    return forged


def test_6_an_optimizer_state_of_another_dtype_is_refused_naming_it(two_rounds):
    alg, state = two_rounds["dp-fedadam"]
    opt = state["opt_state"]
    forged = _forged(state, mu=opt["mu"].double(), nu=opt["nu"].double())
    with pytest.raises(ValueError, match=r"optimizer state mu has dtype torch\.float64, the model "
                       r"torch\.float32"):  # fmt: skip
        alg.load_state_dict(forged)  # before: accepted, refused at the next round's update
    alg.load_state_dict(state)  # the state as saved loads


@pytest.mark.parametrize("count", [0, 1, 3])
def test_6_an_optimizer_state_of_another_number_of_updates_is_refused(two_rounds, count):
    alg, state = two_rounds["dp-fedadam"]
    with pytest.raises(ValueError, match=rf"has count = {count} updates, its model is at round 2"):
        alg.load_state_dict(_forged(state, count=count))  # before: resumed, bias correction reset
    adadp, adadp_state = two_rounds["dp-fedavg-adadp"]
    assert adadp_state["opt_state"]["accepted"] + adadp_state["opt_state"]["rejected"] == 2
    with pytest.raises(ValueError, match=r"has accepted \+ rejected = \d+ updates"):
        adadp.load_state_dict(
            _forged(adadp_state, rejected=adadp_state["opt_state"]["rejected"] + 1)
        )
    adadp.load_state_dict(adadp_state)


# -- finding 7: two --set tables of one key -----------------------------------------------------


def test_7_two_set_tables_of_one_key_are_merged(tmp_path, capsys):
    out = tmp_path / "r"
    tables = ["--set", "task-params={seed=1}", "--set", "task-params={num-users=40}"]
    code = main(["simulate", str(TOY), "--rounds", "1", "--out", str(out), "--quiet", *tables])
    assert code == 0, capsys.readouterr().err  # before: rc 2, "contradicts an earlier --set"
    assert load_config(out / "config.toml").task_params == {"num_users": 40, "seed": 1}
    code = main(["simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / "s"), "--quiet",
                 "--set", "task-params={seed=1}", "--set", "task-params={seed=2}"])  # fmt: skip
    assert code == 2 and "contradicts an earlier --set" in capsys.readouterr().err


# -- finding 8: a resumed config.toml asking for a device this machine lacks ------------------


def test_8_a_resumed_config_asking_for_a_missing_device_is_named(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r"
    assert main(["simulate", str(TOY), "--rounds", "1", "--out", str(out), "--quiet"]) == 0
    stored = out / "config.toml"
    text = stored.read_text().replace("num-server-rounds = 1", "num-server-rounds = 2")
    stored.write_text(text.replace('device = "auto"', 'device = "cuda"'))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    capsys.readouterr()
    assert main(["simulate", "--resume", str(out), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(
        f"fedprivopt simulate: error: {stored}: device must be auto or cpu on this machine"
    )


# -- finding 9: the token store of a replaced dataset -----------------------------------------


def test_9_the_token_store_of_a_replaced_dataset_is_refused(tmp_path, capsys):
    from fedprivopt.models.tag_prediction import StackOverflowTagTask

    d = tmp_path / "d"
    synth = ["data", "synth", "--out", str(d), "--clients", "30", "--vocab", "200", "--tags", "10"]
    assert main([*synth, "--workers", "1"]) == 0
    task = StackOverflowTagTask(
        data_dir=d, synthetic=False, vocab_size=50, num_tags=5, num_users=10, eval_users=5,
        token_cache=True, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    assert main([*synth, "--workers", "1", "--seed", "7", "--overwrite"]) == 0
    capsys.readouterr()
    with pytest.raises(ValueError, match=r"stackoverflow\.sqlite: the dataset changed while "):
        task.encoded_users()  # before: built from the old split, under the new file's key
    assert not any((tmp_path / "cache").glob("**/*.npy"))


# -- finding 10: a checkpoint of a round that was not evaluated --------------------------------


def test_10_a_checkpoint_of_an_unevaluated_last_round_resumes(tmp_path, capsys):
    out = tmp_path / "r"
    sets = ["--set", "eval-every=3", "--set", "checkpoint-every=5"]
    assert main(["simulate", str(TOY), "--rounds", "10", "--out", str(out), "--quiet", *sets]) == 0
    # as if killed after round 5: its checkpoint, its ledger lines and rows
    os.replace(out / "checkpoint.prev.pt", out / "checkpoint.pt")
    for name, keep in (("privacy_ledger.jsonl", 6), ("metrics.jsonl", 1)):
        lines = (out / name).read_text().splitlines(keepends=True)
        (out / name).write_text("".join(lines[:keep]))
    (out / "summary.json").unlink()
    stored = out / "config.toml"
    stored.write_text(stored.read_text().replace("num-server-rounds = 10", "num-server-rounds = 5"))
    capsys.readouterr()
    code = main(["simulate", "--resume", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err  # before: rc 2, "holds no row of round 5"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [3, 5]


# -- finding 11: a tuning's report of a metric named with $ and | -------------------------------


class DollarPipe(ToyClassificationTask):
    """The toy task, its accuracy reported as ``cost_$_per_$_user|p``."""

    METRIC = "cost_$_per_$_user|p"
    primary_metric = METRIC

    def evaluate(self, model):
        metrics = super().evaluate(model)
        return {"loss": metrics["loss"], self.METRIC: metrics["accuracy"]}


def test_11_a_tunings_report_of_a_metric_named_with_dollars_and_a_bar(tmp_path, capsys):
    out = tmp_path / "t"
    code = main(["tune", str(TOY), "--grid", "server-learning-rate=0.5,1", "--mean-trials", "1",
                 "--rounds", "1", "--seed", "1", "--quiet", "--out", str(out),
                 "--set", f'task="{__name__}:DollarPipe"'])  # fmt: skip
    assert code == 0, capsys.readouterr().err  # before: rc 2, mathtext's ParseSyntaxException
    assert (out / "trials.png").is_file()
    header = next(line for line in (out / "report.md").read_text().splitlines()
                  if line.startswith("| trial |"))  # fmt: skip
    assert "eval_cost_$_per_$_user\\|p" in header and header.count(" | ") == 4, header


# -- finding 12: a tuned grid's selection on private users ---------------------------------------


def test_12_a_tuned_grid_says_its_selection_is_not_covered(tmp_path, capsys):
    out = tmp_path / "c"
    task = "tests.reliability.test_thirtyfifth_review_tuning:OverlappingToy"
    grid = ["--tune-grid", "server-learning-rate=0.5,1", "--mean-trials", "1"]
    code = main(["compare", str(TOY), "--strategies", "dp-fedavg", *grid, "--rounds", "1",
                 "--quiet", "--set", f'task="{task}"', "--selection-on-private-users",
                 "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    report = (out / "report.md").read_text()
    assert "**Tuned rows whose epsilon does not (or may not) cover their selection:**" in report
    assert "(dp-fedavg (tuned)): Selection: NOT covered by epsilon. 1 of the task's 4" in report


# -- finding 13: a report's ε and the checkpoint's accountant ---------------------------------


def test_13_a_report_takes_the_checkpoints_epsilon_beside_a_cut_ledger(tmp_path):
    from fedprivopt.simulation.rundata import load_run

    out = tmp_path / "r"
    assert main(["simulate", str(TOY), "--rounds", "5", "--out", str(out), "--quiet"]) == 0
    full = load_run(out).ledger_epsilon
    ledger = out / "privacy_ledger.jsonl"
    ledger.write_text("".join(ledger.read_text().splitlines(keepends=True)[:2]))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = rows[0]["epsilon"]
    (out / "metrics.jsonl").write_text("".join(json.dumps({**r, "epsilon": first}) + "\n"
                                               for r in rows))  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    summary["epsilon"] = first
    (out / "summary.json").write_text(json.dumps(summary))
    run = load_run(out)
    assert run.ledger_epsilon == pytest.approx(full) and full > 1.9 * first  # before: round 1's
    assert "checkpoint.pt (its accountant) 15.0342); the largest is reported" in run.warnings[0]


# -- finding 14: apostrophes are no quotes -------------------------------------------------------


def test_14_apostrophes_far_apart_are_not_cut_as_a_value():
    sentence = ("ray-address: auto finds no Ray cluster this machine is a node of (`ray start` "
                "records its head's address in /tmp/ray/ray_current_cluster, and there is none): "
                "start one with `ray start --head` (or join one with `ray start --address "
                "HEAD:PORT`), or give the head's host:port (docs/SCALING.md)")  # fmt: skip
    assert one_line(sentence) == sentence  # before: "... the head' (165 characters)s host:port"
    long = "x" * 300
    assert one_line(f"got '{long}'").endswith("xxx' (300 characters)")  # still cut


# -- finding 15: the other members' own exceptions ------------------------------------------------


class BuildRaises(MinimalTask):
    def build_model(self):
        raise OSError("weights file gone")


class EvaluateRaises(MinimalTask):
    def evaluate(self, model):
        raise KeyError("labels")


class ReferenceRaises(MinimalTask):
    def reference(self):
        raise RuntimeError("no public counts")


class CohortRaises(MinimalTask):
    def cohort_trainer(self, *, device, chunk_users):
        raise RuntimeError("no such kernel")


def factory_raises(**params):
    raise OSError("damaged data file")


@pytest.mark.parametrize(
    ("task", "line"),
    [
        ("BuildRaises", "BuildRaises.build_model() raised OSError at "),
        ("EvaluateRaises", "EvaluateRaises.evaluate() raised KeyError at "),
        ("ReferenceRaises", "ReferenceRaises.reference() raised RuntimeError at "),
        ("CohortRaises", "CohortRaises.cohort_trainer() raised RuntimeError at "),
        ("factory_raises", "the factory raised OSError at "),
    ],
)
def test_15_a_members_own_exception_is_one_line(tmp_path, capsys, task, line):
    code = main(["simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / "r"), "--quiet",
                 "--set", f"task={__name__}:{task}", "--set", "population=6",
                 "--set", "clients-per-round=3", "--set", "task-params.num-users=6"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err[-2000:]  # before: a traceback, rc 1
    assert line in err and f"{HERE}:" in err, err


# -- finding 16: an evaluate() that registers a buffer on its model ----------------------------


class EvaluateKeeps(MinimalTask):
    """The minimal task whose evaluate() registers a buffer on the model it is given."""

    def evaluate(self, model):
        model.register_buffer("zz", torch.ones(1))
        return super().evaluate(model)


def test_16_an_evaluate_that_registers_a_buffer_runs(tmp_path, capsys):
    out = tmp_path / "r"
    code = main(["simulate", str(TOY), "--rounds", "3", "--out", str(out), "--quiet",
                 "--set", f"task={__name__}:EvaluateKeeps", "--set", "population=6",
                 "--set", "clients-per-round=3", "--set", "task-params.num-users=6"])  # fmt: skip
    assert code == 0, capsys.readouterr().err[-2000:]  # before: a traceback at evaluation 2
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in rows] == [1, 2, 3]
