"""Issue 15, thirty-fourth hostile review (users' own tasks and the client-side trainer).

A task of one's own (``task = "module:Name"``, ``docs/TASKS.md``), run by ``fedprivopt
simulate`` on the fast engine (the per-user :class:`~fedprivopt.clients.LocalTrainer`):

1. A float64 model (``build_model()`` returning ``model.double()``): ``simulate toy.toml --set
   task=m:T --set population=6 --set clients-per-round=3 --rounds 2`` ended rc 0 with
   ``eval_accuracy`` 0.435 where the float32 model reached 0.775: ``LocalTrainer`` returned
   every update as float32 and the server, which aggregates in the model's dtype (float64),
   rejected each one (``metrics.jsonl``: ``accepted`` 0, ``rejected`` 5): every round released
   noise only, charged, and said nothing. Now the trainer returns the update in the model's
   flat dtype: ``accepted`` 5 of 5 and the float32 model's accuracy (also with distributed
   noise, ``fast-actors``, DP-FedAdam, AdaDPS' public users and ADADP). The Flower engine's
   messages still carry float32 (left to their owner, see the report).
2. A model with a buffer (a registered constant its forward divides by, batch-norm statistics,
   a counter): no client changes a buffer (its entries of every update are zero), but the
   server's noise and optimizer steps moved it every round, as they move a trainable
   parameter: a normalization constant of 3.0 was 6.02, 2.43, 3.76 and 2.68 after two rounds
   at ``noise-multiplier = 5``. Now :func:`~fedprivopt.models.task.frozen_mask` marks buffers
   as it marks frozen parameters: the server drops the noise drawn there (post-processing of
   coordinates that are the same for every dataset) and the buffer keeps its value.
3. A task module that calls ``sys.exit()``: at import (``exit()`` left at the end of a script:
   rc 0, no line, nothing run: a success), a training script's ``argparse`` at module level
   (rc 2, ``usage: fedprivopt [-h] [--epochs EPOCHS]`` and ``fedprivopt: error: unrecognized
   arguments: simulate …``: fedprivopt's own arguments called wrong), in its factory, or in
   ``loss``/``user_data`` during the run (rc 0 mid-run, no line). ``SystemExit`` is no
   ``Exception``, so no handler took it for an error. Now one line, rc 2: ``task 'm:T': module
   'm' does not import: it called sys.exit(2) while importing after writing 'fedprivopt:
   error: unrecognized argume…' (a script's own code belongs under ``if __name__ ==
   "__main__":``)``; ``T.loss() must return the mean loss of the minibatch; it called
   sys.exit(0)``. What a module writes to stderr while it imports (a warning) is still written.
4. A ``loss(model, x, y)`` that calls ``backward()`` on the loss before returning it (as a
   training loop's step would): autograd's ``Trying to backward through the graph a second
   time`` traceback (rc 1) at the trainer's gradient, naming neither task nor member; with
   ``backward(retain_graph=True)`` AdaDPS' ``public-users`` side information summed each
   gradient twice (a preconditioner of 4 g², silently). Now one line, rc 2: ``T.loss() must
   return the mean loss of the minibatch without calling backward() on it (the trainer takes
   the gradient); it set the gradients of the model's parameters``
   (``models.task_calls.minibatch_loss``).
5. Dtypes other than the flat one: a float32 model with one float64 buffer (``torch.from_numpy``
   of a NumPy mean) was refused as ``parameter 'weight' has dtype torch.float32;
   LocalTrainer needs every parameter in the flat dtype torch.float64``, naming neither the
   buffer nor why the flat vector was float64; and a frozen float16 layer (a pre-trained
   projection) was refused the same way, although the trainer's documentation asks the flat
   dtype of *trainable* parameters only (frozen ones are never trained). Now the message names
   the entry that set the flat dtype (``… (the widest dtype of the state dict: buffer 'mean' is
   torch.float64; give the trainable parameters and the floating-point buffers one dtype)``),
   and frozen parameters of any dtype are loaded as buffers are: the float16 layer trains
   (``rc 0``) and keeps its weights.
6. A model whose forward keeps a running mean of its inputs in a buffer registered with
   ``persistent=False`` (outside the state dict, so never loaded from the global model): the
   trainer, which keeps one model for all the users it trains, carried it from one user to the
   next, so user 3's update trained after users 0-2 differed from user 3's alone (by 0.0048 in
   an entry): a user's data reached other users' updates, the sum's sensitivity to one user was
   no longer ``C``, and an update depended on which users a shard trained before it. Now such
   buffers are set back to their values of ``build_model()`` before every user: the two updates
   are equal.
7. A ``loss`` that augments its minibatch with NumPy's global generator (``np.random.normal``,
   a common idiom; Python's ``random`` alike): the trainer forked and seeded torch's global
   generator only, so two ``simulate`` runs of the same seed ended at ``eval_accuracy`` 0.76
   and 0.75, and a resumed run could not equal an uninterrupted one, though the trainer's
   documentation promises the same update "whatever the global random states are". Now
   NumPy's and Python's global generators are seeded from the same key for the call and
   restored afterwards: 0.755 both times.
8. ``clients.noise_generator`` (the noise-share generator a ClientApp of one's own calls, and
   ``TrainMessage.privatize``) keyed its generator by ``int(round_num)``, ``int(user_id)`` and
   ``str(stream)``: user 1.7, ``True`` and ``"1"`` drew user 1's noise, round 1.9 round 1's
   (the same share for two keys), a stream of ``None`` the stream ``"None"``, and ``secure =
   "false"`` (a configuration's string) secure mode. Now each is refused naming it (NumPy
   integers are ids), as the trainers refuse them since the twenty-fifth review.

What held is listed in the report (RELIABILITY §7's rows of this review).
"""

from __future__ import annotations

import json
import random
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedprivopt.cli import main
from fedprivopt.clients import LocalConfig, LocalTrainer, noise_generator
from fedprivopt.models import frozen_mask, initial_flat
from fedprivopt.models.task import TaskError
from fedprivopt.privacy import RngFactory
from tests.models.minimal_task import MinimalTask

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
REF = f"{__name__}:OwnTask"


class _Scaled(torch.nn.Module):
    """A linear model of inputs divided by a constant buffer (a fixed normalization)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((dim,), 3.0))
        self.lin = torch.nn.Linear(dim, 2)
        with torch.no_grad():
            self.lin.weight.zero_()
            self.lin.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x / self.scale)


class _HalfFrozen(torch.nn.Module):
    """A frozen float16 projection (the identity) before a trainable float32 model."""

    def __init__(self, model: torch.nn.Module, dim: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim, bias=False, dtype=torch.float16)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(dim))
        self.proj.requires_grad_(False)
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.proj(x.half()).float())


class _Remembers(torch.nn.Module):
    """A linear model of inputs minus a running mean of them kept outside the state dict."""

    def __init__(self, model: torch.nn.Module, dim: int) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(dim), persistent=False)
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.seen.mul_(0.9).add_(0.1 * x.mean(0))
        return self.model(x - self.seen)


class OwnTask(MinimalTask):
    """The minimal task, changed as ``mode`` says."""

    def __init__(self, *, mode: str = "ok", **params) -> None:
        super().__init__(**params)
        self.mode = mode
        if mode == "factory-exit":
            sys.exit(0)

    def _x(self, x: torch.Tensor) -> torch.Tensor:
        return x.double() if self.mode == "float64" else x

    def build_model(self) -> torch.nn.Module:
        if self.mode == "buffer":
            return _Scaled(self._dim)
        model = super().build_model()
        if self.mode == "float64-buffer":
            model.register_buffer("mean", torch.zeros(self._dim, dtype=torch.float64))
        if self.mode == "half-frozen":
            return _HalfFrozen(model, self._dim)
        if self.mode == "remembers":
            return _Remembers(model, self._dim)
        return model.double() if self.mode == "float64" else model

    def user_data(self, user_id: int):
        if self.mode == "data-exit":
            sys.exit(3)
        return super().user_data(user_id)

    def loss(self, model, x, y):
        if self.mode == "loss-exit":
            sys.exit(0)
        if self.mode == "numpy-aug":
            x = x + torch.from_numpy(np.random.normal(0.0, 0.5, size=tuple(x.shape))).float()
        if self.mode == "python-aug":
            x = x * random.random()
        loss = F.cross_entropy(model(self._x(x)), y)
        if self.mode.startswith("backward"):
            loss.backward(retain_graph=self.mode == "backward-retained")
        return loss

    def evaluate_data(self, model, x, y):
        return super().evaluate_data(model, self._x(x), y)


def _simulate(out: Path, capsys, mode: str, *extra: str, task: str = REF) -> tuple[int, str]:
    """``simulate`` of ``task`` in ``mode`` for one round: (rc, stderr)."""
    args = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), "--quiet"]
    args += ["--set", f"task={task}", "--set", "population=6", "--set", "clients-per-round=4"]
    args += ["--set", f'task-params={{num-users=6, mode="{mode}"}}', *extra]
    code = main(args)
    return code, capsys.readouterr().err


def _one_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_1_a_float64_model_trains(tmp_path, capsys):
    code, err = _simulate(tmp_path / "f64", capsys, "float64")
    assert code == 0, err
    (row,) = _rows(tmp_path / "f64")
    assert row["received"] > 0 and row["accepted"] == row["received"], row
    assert row["rejected"] == 0


def test_1_the_trainer_returns_the_model_dtype():
    config = LocalConfig(learning_rate=0.1, clip_norm=1.0)
    for mode, dtype in (("float64", torch.float64), ("ok", torch.float32)):
        task = OwnTask(mode=mode)
        result = LocalTrainer(task, device="cpu").train(
            initial_flat(task), user_id=1, round_num=1, config=config, rngs=RngFactory(0)
        )
        assert result.delta.dtype == dtype and result.norm > 0


def test_2_buffers_keep_their_value_under_the_servers_noise(tmp_path, capsys):
    out = tmp_path / "buffer"
    code, err = _simulate(out, capsys, "buffer", "--set", "noise-multiplier=5")
    assert code == 0, err
    params = torch.load(out / "checkpoint.pt", weights_only=False)["algorithm"]["params"]
    assert params[:4].tolist() == [3.0] * 4  # the buffer, first in the state dict
    assert bool((params[4:] != 0).any())  # the noised weights moved
    mask = frozen_mask(OwnTask(mode="buffer"))
    assert mask is not None and mask.tolist() == [True] * 4 + [False] * 10


def test_2_a_model_without_buffers_or_frozen_parameters_has_no_mask():
    assert frozen_mask(OwnTask()) is None


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    """A directory on ``sys.path`` for task modules; they are forgotten afterwards."""
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith("review34_"):
            del sys.modules[name]


def _module(folder: Path, name: str, body: str) -> str:
    head = f"from {__name__} import OwnTask\n"
    (folder / f"{name}.py").write_text(head + textwrap.dedent(body))
    return f"{name}:OwnTask"


def test_3_a_module_that_exits_at_import_is_one_line(tmp_path, capsys, module_dir):
    task = _module(module_dir, "review34_exits", "import sys\nsys.exit(0)\n")
    out = tmp_path / "exits"
    line = _one_line(*_simulate(out, capsys, "ok", task=task))
    assert "task 'review34_exits:OwnTask': module 'review34_exits' does not import" in line
    assert "it called sys.exit(0) while importing" in line
    assert not out.exists()


def test_3_a_script_parsing_the_command_line_at_import_is_one_line(
    tmp_path, capsys, module_dir, monkeypatch
):
    monkeypatch.setattr(sys, "argv", ["fedprivopt", "simulate"])  # what its parser reads
    body = """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=1)
        args = parser.parse_args()
    """
    task = _module(module_dir, "review34_script", body)
    line = _one_line(*_simulate(tmp_path / "script", capsys, "ok", task=task))
    wrote = "'fedprivopt: error: unrecognized arguments: simulate'"
    assert f"it called sys.exit(2) while importing after writing {wrote}" in line
    assert 'belongs under `if __name__ == "__main__":`' in line


def test_3_what_a_module_writes_while_importing_is_still_written(tmp_path, capsys, module_dir):
    body = "import sys\nprint('review34: a warning of the module', file=sys.stderr)\n"
    task = _module(module_dir, "review34_warns", body)
    code, err = _simulate(tmp_path / "warns", capsys, "ok", task=task)
    assert code == 0, err
    assert "review34: a warning of the module" in err


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("factory-exit", f"task '{REF}': the factory must return a Task; it called sys.exit(0)"),
        ("data-exit", "OwnTask.user_data(0) must return (x, y); it called sys.exit(3)"),
        ("loss-exit", "OwnTask.loss() must return the mean loss of the minibatch; it called "),
    ],
)
def test_3_a_task_that_exits_is_one_line(tmp_path, capsys, mode, said):
    line = _one_line(*_simulate(tmp_path / mode, capsys, mode))
    assert said in line


def test_3_the_trainer_raises_the_tasks_error():
    task = OwnTask(mode="loss-exit")
    with pytest.raises(TaskError, match=r"it called sys.exit\(0\)"):
        LocalTrainer(task, device="cpu").train(
            initial_flat(task),
            user_id=0,
            round_num=1,
            config=LocalConfig(learning_rate=0.1, clip_norm=1.0),
            rngs=RngFactory(0),
        )


def test_4_a_loss_that_calls_backward_is_one_line(tmp_path, capsys):
    line = _one_line(*_simulate(tmp_path / "backward", capsys, "backward"))
    assert line.endswith(
        "OwnTask.loss() must return the mean loss of the minibatch without calling backward() "
        "on it (the trainer takes the gradient); it set the gradients of the model's parameters"
    )


def test_4_public_users_gradients_are_not_counted_twice():
    from fedprivopt.models.side_information import public_users_preconditioner

    with pytest.raises(TaskError, match=r"without calling backward\(\) on it"):
        public_users_preconditioner(OwnTask(mode="backward-retained"), [0, 1], batch_size=4)
    assert public_users_preconditioner(OwnTask(), [0, 1], batch_size=4).shape == (10,)


def test_5_the_refusal_names_the_entry_that_set_the_flat_dtype(tmp_path, capsys):
    line = _one_line(*_simulate(tmp_path / "f64-buffer", capsys, "float64-buffer"))
    assert line.endswith(
        "parameter 'weight' has dtype torch.float32; LocalTrainer needs every trainable parameter"
        " in the flat dtype torch.float64 (the widest dtype of the state dict: buffer 'mean' is "
        "torch.float64; give the trainable parameters and the floating-point buffers one dtype)"
    )


def test_5_a_frozen_float16_layer_trains_and_keeps_its_weights(tmp_path, capsys):
    out = tmp_path / "half-frozen"
    code, err = _simulate(out, capsys, "half-frozen")
    assert code == 0, err
    (row,) = _rows(out)
    assert row["accepted"] == row["received"] > 0, row
    params = torch.load(out / "checkpoint.pt", weights_only=False)["algorithm"]["params"]
    assert params[:16].tolist() == torch.eye(4).reshape(-1).tolist()  # proj.weight, first
    task = OwnTask(mode="half-frozen")
    trainer = LocalTrainer(task, device="cpu")
    config = LocalConfig(learning_rate=0.1, clip_norm=1.0)
    result = trainer.train(
        initial_flat(task), user_id=2, round_num=1, config=config, rngs=RngFactory(0)
    )
    assert result.norm > 0 and not bool(result.delta[:16].any())
    assert trainer.model.proj.weight.dtype == torch.float16


def test_6_nothing_of_one_users_data_reaches_the_next_users_update():
    task = OwnTask(mode="remembers")
    config = LocalConfig(learning_rate=0.5, clip_norm=10.0)
    w, rngs = initial_flat(task), RngFactory(0)
    alone = LocalTrainer(task, device="cpu").train(
        w, user_id=3, round_num=1, config=config, rngs=rngs
    )
    trainer = LocalTrainer(task, device="cpu")
    for user in (0, 1, 2):
        trainer.train(w, user_id=user, round_num=1, config=config, rngs=rngs)
    after = trainer.train(w, user_id=3, round_num=1, config=config, rngs=rngs)
    assert after.norm > 0 and torch.equal(after.delta, alone.delta)
    # left as built after each user (forty-second review follow-up, privacy 3); it held user
    # 3's running mean until the next load
    assert not bool(trainer.model.seen.any())
    trainer.load_global(w)
    assert not bool(trainer.model.seen.any())


@pytest.fixture
def global_generators():
    """NumPy's and Python's global states, restored after the test."""
    states = np.random.get_state(), random.getstate()
    yield
    np.random.set_state(states[0])
    random.setstate(states[1])


def test_7_numpys_and_pythons_global_generators_are_seeded_for_the_call(global_generators):
    config = LocalConfig(learning_rate=0.5, clip_norm=10.0)
    for mode in ("numpy-aug", "python-aug"):
        task = OwnTask(mode=mode)
        trainer, w = LocalTrainer(task, device="cpu"), initial_flat(task)
        deltas = []
        for state in (1, 2):
            np.random.seed(state)
            random.seed(state)
            result = trainer.train(w, user_id=1, round_num=1, config=config, rngs=RngFactory(0))
            deltas.append(result.delta)
            assert np.random.randint(10**9) == np.random.RandomState(state).randint(10**9)
            assert random.random() == random.Random(state).random()
        assert torch.equal(*deltas), mode


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("user_id", 1.7, "user_id must be an integer >= 0, got 1.7"),
        ("user_id", True, "user_id must be an integer >= 0, got True"),
        ("user_id", "1", "user_id must be an integer >= 0, got '1'"),
        ("round_num", 1.9, "round_num must be an integer >= 0, got 1.9"),
        ("stream", None, "stream must be a non-empty string, got None"),
        ("secure", "false", "secure must be true or false, got 'false'"),
    ],
)
def test_8_noise_generator_refuses_keys_it_would_convert(key, value, said):
    keys = {"seed": 3, "secure": False, "round_num": 1, "user_id": 1, key: value}
    with pytest.raises(ValueError, match=said):
        noise_generator(**keys)


def test_8_numpy_integers_are_keys():
    a = noise_generator(seed=3, secure=False, round_num=np.int64(2), user_id=np.int32(1))
    b = noise_generator(seed=3, secure=False, round_num=2, user_id=1)
    assert torch.equal(torch.randn(3, generator=a), torch.randn(3, generator=b))
