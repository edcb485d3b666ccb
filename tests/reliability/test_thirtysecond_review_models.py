"""Issue 15, thirty-second hostile review (tasks and trainers): regression tests of its findings.

A task of one's own (``task = "module:Name"``, ``docs/TASKS.md``) that breaks the protocol of
its required members, run by ``fedprivopt simulate`` (the fast engine, ``vectorize`` either way;
the per-user :class:`~fedprivopt.clients.LocalTrainer` trains it, as a ClientApp does):

1. ``user_data(user)`` returning ``x`` and ``y`` of different lengths (an off-by-one), numpy
   arrays, ``None`` or 0-dimensional tensors ended at the first trained user in an
   ``IndexError`` (``index 11 is out of bounds for dimension 0 with size 11``),
   ``AttributeError`` (``'numpy.ndarray' object has no attribute 'to'``) or ``TypeError``
   traceback from ``clients/trainer.py``, rc 1, naming neither the task nor the member (AdaDPS'
   ``public-users`` side information read it unchecked as well). Now rc 2, one line: ``Bad.
   user_data(0) must return (x, y): two tensors with one row per example, as many in y as in x;
   got a tuple of 2 (a torch.float32 tensor of shape (12, 4), a torch.int64 tensor of shape
   (11,))`` (``models.task_calls.user_examples``).
2. ``loss(model, x, y)`` returning the per-example losses (``reduction="none"``), a Python
   float, an integer tensor, ``None`` or a detached tensor ended in autograd's ``grad can be
   implicitly created only for scalar outputs``, ``'float' object is not iterable`` or
   ``element 0 of tensors does not require grad`` traceback, rc 1 (in the local steps and in
   AdaDPS' ``public-users`` gradients). Now rc 2, one line: ``Bad.loss() must return the mean
   loss of the minibatch, a floating-point tensor of one value computed from the model; got a
   torch.float32 tensor of shape (12,)`` (``models.task_calls.minibatch_loss``).
3. A model whose parameters all have ``requires_grad = False`` ended in autograd's ```inputs`
   argument to `grad()` cannot be empty`` traceback, rc 1, at the first local step. Now
   ``LocalTrainer`` refuses it when built, one line: ``the model of Bad.build_model() has no
   trainable parameter …: there is nothing to train``.
4. The tag task's vectorized trainer (``TagCohortTrainer``) cut a round's users into chunks by
   their number only, and lays out every example visit's words of a chunk at once (0.7-1.1 kB a
   visit), so its memory grew with ``chunk x epochs x examples``: ``simulate
   stackoverflow-tp-mini.toml --set local-epochs=1000 --set clients-per-round=100`` (100 users
   of a 120-client synthetic dataset) peaked at 1.72 GB where ``vectorize = false`` took
   0.37 GB; 10,000 epochs (``local-epochs``' bound) with ``max-examples`` unset 3.3 GB for 20
   users, about ten times that for 100. Now a chunk holds at most ``CHUNK_VISITS`` = 2**18
   visits (a user with more trains alone): 0.46 GB above the process for those 100 users at
   1,000 epochs (0.91 GB at 2**19, 3 GB uncut); the presets' chunks (at most 65,536 visits)
   are cut as before. A user with more visits alone (209 examples, 3,000 epochs: 1.06 GB) has
   its words laid out a window of whole local steps of at most ``CHUNK_VISITS`` visits at a time
   (0.47 GB; 10,000 epochs 0.58 GB), its update the same to the bit.

What held (about 150 cases): the cohort trainers against ``LocalTrainer`` on edge users (0 to
15 examples, ``max_examples`` 1, ``batch_size`` 1 and 10**6, 3 and 5 local epochs, C 1e-30 and
1e30, adaptive clipping's bits; the next-word task at ``seq_len`` 1, ``vocab_size`` 1 and both),
equal to float tolerance, norms too; tasks of one's own with float16, complex, integer
parameters, integer and boolean buffers, some frozen parameters, no parameter, 2**26 + 1
parameters, a NaN, infinite or 1e38-scaled loss, users without examples; ``device = "cuda"``
on a CPU-only machine, ``cohort-chunk`` 0 and 1e9, ``public-users`` at population - cohort and
one above, its ``eps`` at 1e-300 and 1e300, public users without examples.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedprivopt.cli import main
from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.models import build_task, initial_flat, tag_prediction_cohort
from fedprivopt.models.task import TaskError
from fedprivopt.privacy import RngFactory
from tests.models.minimal_task import MinimalTask
from tests.tag_synth import make_synth_dir, tag_task

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
REF = f"{__name__}:BadTask"


class BadTask(MinimalTask):
    """The minimal task, one member broken as ``mode`` says."""

    def __init__(self, *, mode: str = "ok", **params) -> None:
        super().__init__(**params)
        self.mode = mode

    def build_model(self) -> torch.nn.Module:
        model = super().build_model()
        if self.mode == "all-frozen":
            for p in model.parameters():
                p.requires_grad_(False)
        return model

    def user_data(self, user_id: int):
        x, y = super().user_data(user_id)
        return {
            "y-short": (x, y[:-1]),
            "numpy": (x.numpy(), y.numpy()),
            "none": None,
            "scalars": (x[0, 0], y[0]),
        }.get(self.mode, (x, y))

    def loss(self, model, x, y):
        loss = super().loss(model, x, y)
        if self.mode == "per-example":
            return F.cross_entropy(model(x), y, reduction="none")
        return {
            "float": lambda: float(loss.detach()),
            "detached": loss.detach,
            "integer": lambda: torch.tensor(1),
        }.get(self.mode, lambda: loss)()


def _simulate(tmp_path, capsys, mode: str, *extra: str) -> str:
    """``simulate`` of BadTask in ``mode`` for one round: its one stderr line (rc 2 asserted)."""
    args = ["simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / mode)]
    args += ["--set", f"task={REF}", "--set", "population=6", "--set", "clients-per-round=3"]
    args += ["--set", f'task-params={{num-users=6, mode="{mode}"}}', *extra]
    code = main(args)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_bad_task_runs_when_nothing_is_broken(tmp_path, capsys):
    args = ["simulate", str(TOY), "--rounds", "1", "--out", str(tmp_path / "ok")]
    args += ["--set", f"task={REF}", "--set", "population=6", "--set", "clients-per-round=3"]
    assert main([*args, "--set", "task-params.num-users=6"]) == 0


@pytest.mark.parametrize(
    ("mode", "got"),
    [
        ("y-short", "a torch.int64 tensor of shape (11,))"),
        ("numpy", "got a tuple of 2 ('ndarray', 'ndarray')"),
        ("none", "got 'NoneType'"),
    ],
)
def test_1_user_data_of_another_form_is_one_line(tmp_path, capsys, mode, got):
    line = _simulate(tmp_path, capsys, mode)
    assert "BadTask.user_data(" in line
    assert "must return (x, y): two tensors with one row per example, as many in y as in x" in line
    assert got in line


def test_1_the_per_user_trainer_and_public_users_check_user_data():
    task = BadTask(mode="scalars")
    trainer = LocalTrainer(task, device="cpu")
    config = LocalConfig(learning_rate=0.1, clip_norm=1.0)
    with pytest.raises(TaskError, match=r"BadTask.user_data\(2\) must return \(x, y\)"):
        trainer.train(initial_flat(task), user_id=2, round_num=1, config=config, rngs=RngFactory(0))
    from fedprivopt.models.side_information import public_users_preconditioner

    with pytest.raises(TaskError, match=r"shape \(\), a torch.int64 tensor of shape \(\)\)"):
        public_users_preconditioner(task, [0], batch_size=4)


@pytest.mark.parametrize(
    ("mode", "got"),
    [
        ("per-example", "got a torch.float32 tensor of shape (12,)"),
        ("float", "got 'float'"),
        ("integer", "got a torch.int64 tensor of shape ()"),
        ("detached", "that does not require grad (not computed from the model parameters)"),
    ],
)
def test_2_a_loss_of_another_form_is_one_line(tmp_path, capsys, mode, got):
    line = _simulate(tmp_path, capsys, mode)
    assert "BadTask.loss() must return the mean loss of the minibatch, a floating-point " in line
    assert got in line


def test_2_public_users_side_information_checks_the_loss(tmp_path, capsys):
    line = _simulate(
        tmp_path,
        capsys,
        "per-example",
        *("--strategy", "adadps", "--set", "side-information.kind=public-users"),
        *("--set", "side-information.users=1"),
    )
    assert "side-information.kind = 'public-users'" in line
    assert "BadTask.loss() must return the mean loss" in line


def test_3_a_model_without_a_trainable_parameter_is_one_line(tmp_path, capsys):
    line = _simulate(tmp_path, capsys, "all-frozen", "--set", "vectorize=false")
    assert "the model of BadTask.build_model() has no trainable parameter" in line
    assert line.endswith("there is nothing to train")
    with pytest.raises(TaskError, match="no trainable parameter"):
        LocalTrainer(BadTask(mode="all-frozen"), device="cpu")


def test_3_package_tasks_still_build_their_trainer():
    toy = build_task("toy", num_users=3)
    assert LocalTrainer(toy, device="cpu").spec.numel > 0


def test_4_a_tag_chunk_holds_at_most_chunk_visits_example_visits(tmp_path_factory, monkeypatch):
    task = tag_task(make_synth_dir(tmp_path_factory, "review32-models"))
    users = list(range(12))
    config = LocalConfig(learning_rate=1.0, epochs=3, batch_size=4, max_examples=6, clip_norm=0.5)
    visits = [3 * min(size, 6) for size in task.user_sizes(users)]
    limit = 40
    monkeypatch.setattr(tag_prediction_cohort, "CHUNK_VISITS", limit, raising=False)
    w, rngs = initial_flat(task), RngFactory(seed=3)
    trainer = task.cohort_trainer(device="cpu", chunk_users=256)
    got, chunks = {}, []
    for batch in trainer.train_batches(w, users, round_num=1, config=config, rngs=rngs):
        chunks.append([u for u, _ in batch.split()])
        got.update((u, update.to_dense().clone()) for u, update in batch.split())
    assert [u for chunk in chunks for u in chunk] == users
    assert len(chunks) > 4  # 4 before (CPU_CHUNKS), whatever their visits
    for chunk in chunks:
        assert len(chunk) == 1 or sum(visits[u] for u in chunk) <= limit
    local = LocalTrainer(task, device="cpu")
    for u in users:
        ref = local.train(w, user_id=u, round_num=1, config=config, rngs=rngs).delta
        torch.testing.assert_close(got[u], ref, rtol=1e-4, atol=2e-6)


def test_4_a_heavy_user_is_laid_out_a_window_of_steps_at_a_time(tmp_path_factory, monkeypatch):
    task = tag_task(make_synth_dir(tmp_path_factory, "review32-models-heavy"))
    user = max(range(20), key=lambda u: task.user_sizes([u])[0])
    config = LocalConfig(learning_rate=1.0, epochs=6, batch_size=3, clip_norm=0.5)
    w, rngs = initial_flat(task), RngFactory(seed=4)

    def update() -> torch.Tensor:
        trainer = task.cohort_trainer(device="cpu", chunk_users=1)
        (batch,) = trainer.train_batches(w, [user], round_num=1, config=config, rngs=rngs)
        return batch.split()[0][1].to_dense().clone()

    whole = update()
    laid_out = []
    stream = tag_prediction_cohort.TagCohortTrainer._stream

    def recorded(visits, *args):
        laid_out.append(int(visits.numel()))
        return stream(visits, *args)

    monkeypatch.setattr(tag_prediction_cohort, "CHUNK_VISITS", 10, raising=False)
    monkeypatch.setattr(tag_prediction_cohort.TagCohortTrainer, "_stream", staticmethod(recorded))
    windowed = update()
    assert max(laid_out) <= 10 < 6 * task.user_sizes([user])[0]  # one step is 3 visits
    assert torch.equal(windowed, whole)
