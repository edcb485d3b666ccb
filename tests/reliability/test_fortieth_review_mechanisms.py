"""Issue 15, fortieth hostile review (mechanisms: clipping, noise, aggregation, the wire): tests.

1. ``clip_l2(torch.tensor([0.1], dtype=torch.float64), Fraction(1, 10))`` (a clip norm that is
   no float: a ``Fraction``, the integer ``2**54 - 1`` with a vector ``[2.0**54]``, a
   ``numpy.longdouble`` of ``1 - 2**-60`` with ``[1.0]``; ``clip_factor`` alike). Before: the
   clip norm was read as the nearest float, which lies above it, and the vector was returned
   unclipped (``clipped`` False) with an exact norm above ``C`` (0.1000000000000000055 for
   1/10; 2**54 for 2**54 - 1; 1 for 1 - 2**-60). Now the clip norm is read as the largest float
   not above it (``clip.float_at_most``): every result's exact norm is at most ``C``, and a
   float ``C`` is read as before (every run's bits unchanged).
2. ``NoisyMeanAggregator(clip_norm=1000, noise_multiplier=100, expected_cohort_size=1000)
   .aggregate(..., dtype=torch.float16)`` (noise std 100 on the mean, which float16 holds; also a
   float32 model at ``clip_norm=1e35``, ``noise_multiplier=1e5``, ``expected_cohort_size=1e10``).
   Before: the sum is kept in float64 for such models (thirty-eighth review; DESIGN.md: "the sum
   and its noise are kept in float64"), but the noise was drawn in the model's dtype: every
   draw beyond 65504 (3.4e38) was infinite, so about half the released mean was ``±inf`` (all of
   it for float32), reported with noise std 100 (1e30). Now the noise is drawn in the sum's
   dtype (``NoisyMeanAggregator.aggregate``) and the mean rounded to the model's dtype after:
   finite, std about 100; a float32 sum (every float32 run below ``C`` 1.7e30) as before.
3. ``simulate toy.toml --engine flower`` of a task by reference whose model has a frozen
   bfloat16 layer beside float32 parameters (``torch.nn.Linear(d, d, dtype=torch.bfloat16)``,
   ``requires_grad_(False)``; a bfloat16 buffer alike), which the fast engine runs (rc 0,
   ``eval_accuracy`` 0.91). Before: rc 1 and a traceback, ``TypeError: Got unsupported
   ScalarType BFloat16`` from Flower's ``ArrayRecord`` (NumPy has no bfloat16) in
   ``flat_to_arrays``, before round 1 (``DPStrategy.start`` and every train message alike).
   Now ``flat_to_arrays`` sends a bfloat16 tensor as float32, which holds it exactly, and
   ``check_initial_arrays`` expects that layout (``flower_arrays.wire_spec``): the round runs,
   and the ClientApp's flat model (``TrainMessage.read``, ``state_to_flat``) is the server's to
   the bit. Tested with a scripted grid (no Flower simulation).
4. A task by reference whose model keeps a running mean of its inputs in an attribute that is a
   NumPy array (``self.stats += x.mean(0).numpy()``), a ``bytearray``, a tensor inside a tuple
   (``self.stats[0].add_(...)``) or a ``types.SimpleNamespace`` (``self.stats.mean = ...``),
   made in ``build_model()`` and read by its forward; ``LocalTrainer.train`` of users 0-3 on one
   trainer (the fast engine, a ClientApp). Before: the thirty-sixth review set back buffers,
   plain tensor attributes, lists, dicts and sets only, so user 3's update after users 0-2
   differed from its update alone by 0.59 in an entry (the sum's sensitivity to user 0 above
   ``C``). Now ``ModelAtBuild`` also sets back NumPy arrays, bytearrays, tensors inside tuples,
   lists and dicts, and a namespace's attributes (``ModelAtBuild._save_inner``): the same update
   to the bit.
5. The same with a dropout of the model's own ``torch.Generator`` (``self.rng``, a mask drawn
   per batch: its state after users 0-2 counts their batches, so their examples), a
   ``collections.deque`` or an ``OrderedDict`` it appends to. Before: user 3's update after
   users 0-2 differed from its own (by 0.054 for the generator, 0.59 for the deque; a subclass
   of dict or list was not set back, only the exact types). Now the generator's state is set
   back, and every list, dict, set or deque (subclasses too): the same update. (Other objects'
   inner state, e.g. an instance of a class of one's own holding a tensor, is the task's to
   keep out of its forward: a documented limit, not changed.)
6. ``clients.reply_updates(message, updates, rejected=..., clip_bits=...)`` (a ClientApp of
   one's own) with ``rejected`` ``"3"``, -1, 1.7 or ``None``, or a clip bit ``None``, NaN,
   ``"1"`` or a two-element tensor. Before: sent as 3, -1 and 1 (``None``: int()'s
   ``TypeError`` naming nothing); the clip bits as NaN, NaN, 1.0 and two numbers, which the
   server's round then refuses, dropping that user's update. Now ``ValueError`` naming
   ``rejected`` (an integer >= 0) or ``clip_bits[user]`` (a finite real number).
7. ``wire.read_updates(reply.content)`` (the public reader of a train reply, for a ServerApp of
   one's own) of a reply whose ``update/1`` record holds no ``delta`` array (a rogue or broken
   node). Before: ``KeyError: 'delta'``, naming neither the record nor the user. Now
   ``ValueError`` naming the record, the user and the arrays it holds.
8. ``clients.reply_updates(message, {1: u})`` with ``u`` a NumPy array, a list, ``None``, a meta,
   sparse, complex or int64 tensor. Before: ``AttributeError: ... has no attribute 'detach'``;
   torch's ``NotImplementedError`` (meta) and ``TypeError`` (sparse); the complex update sent as
   its real part and the int64 one as float32, with only torch's warning for the first. Now
   ``ValueError`` naming ``updates[1]`` and what it must be (``messages._check_update``).
"""

from __future__ import annotations

import collections
import types
from fractions import Fraction

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, RecordDict

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.clients.messages import TrainMessage, reply_updates
from fedprivopt.clients.privatize import NoisedShare
from fedprivopt.models import initial_flat
from fedprivopt.models.task import state_to_flat
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.clip import clip_factor, clip_l2
from fedprivopt.privacy.flat import flatten
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.messages import delivered
from tests.models.minimal_task import MinimalTask
from tests.strategies.test_flower_faults import ScriptedGrid


def _exact_sq_norm(vector: torch.Tensor) -> Fraction:
    return sum((Fraction(x) ** 2 for x in vector.double().reshape(-1).tolist()), Fraction(0))


# -- finding 1: a clip norm that is no float ---------------------------------------------------


@pytest.mark.parametrize(
    ("vector", "clip_norm"),
    [
        ([0.1], Fraction(1, 10)),
        ([2.0**54], 2**54 - 1),
        ([1.0], np.longdouble(1) - np.longdouble(2) ** -60),
    ],
)
def test_clip_l2_stays_within_a_clip_norm_that_is_no_float(vector, clip_norm) -> None:
    v = torch.tensor(vector, dtype=torch.float64)
    exact = Fraction(*clip_norm.as_integer_ratio())
    out = clip_l2(v, clip_norm)
    assert _exact_sq_norm(out.vector) <= exact**2
    factor = clip_factor(float(v.norm()), clip_norm, torch.float64)
    assert _exact_sq_norm(v * factor) <= exact**2


def test_a_float_clip_norm_is_read_as_before() -> None:
    v = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert clip_l2(v, 1.0).vector is v
    assert clip_factor(2.0, 1.0, torch.float64) == 0.5 * (1 - 4 * torch.finfo(torch.float64).eps)
    assert clip_l2(v, torch.tensor(1.0)).vector is v  # a one-element tensor as before


# -- finding 2: the noise of a float64 sum drawn in the model's dtype ---------------------------


@pytest.mark.parametrize(
    ("dtype", "clip_norm", "sigma", "cohort"),
    [(torch.float16, 1000.0, 100.0, 1000.0), (torch.float32, 1e35, 1e5, 1e10)],
)
def test_the_noise_of_a_float64_sum_is_drawn_in_float64(dtype, clip_norm, sigma, cohort) -> None:
    agg = NoisyMeanAggregator(
        clip_norm=clip_norm, noise_multiplier=sigma, expected_cohort_size=cohort
    )
    g = torch.Generator().manual_seed(0)
    out = agg.aggregate([(0, torch.ones(4000, dtype=dtype))], dim=4000, dtype=dtype, generator=g)
    mean = out.delta_tilde
    assert mean.dtype == dtype
    assert bool(torch.isfinite(mean).all())
    assert float(mean.double().std()) == pytest.approx(out.noise_std, rel=0.1)


def test_a_float32_sum_draws_its_noise_as_before() -> None:
    agg = NoisyMeanAggregator(clip_norm=1.0, noise_multiplier=1.0, expected_cohort_size=2.0)
    g = torch.Generator().manual_seed(3)
    out = agg.aggregate([(0, torch.zeros(5))], dim=5, generator=g)
    expected = torch.empty(5).normal_(0.0, 1.0, generator=torch.Generator().manual_seed(3)) / 2
    assert torch.equal(out.delta_tilde, expected)


# -- finding 3: a bfloat16 tensor of the model on the Flower wire -------------------------------


class _Keeping(ScriptedGrid):
    """A scripted grid that keeps every train message it sends."""

    def __init__(self):
        super().__init__({})
        self.sent = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.sent += [m for m in messages if m.metadata.message_type == "train"]
        return super().send_and_receive(messages, timeout=timeout)


def test_a_bfloat16_tensor_of_the_model_travels_as_float32(server_side) -> None:
    state = {"proj": torch.tensor([0.1, 1 / 3, 3.0, -7.0]).bfloat16(), "w": torch.zeros(2)}
    flat, spec = flatten(state)  # 6 entries: the scripted nodes' updates
    values = {"strategy": "dp-fedavg", "population": 12, "clients-per-round": 12}
    values |= {"num-server-rounds": 1, "noise-multiplier": 1.0, "seed": 1}
    config = StrategyConfig.from_mapping(values)
    strategy = DPStrategy(build_algorithm(config, flat), spec, node_wait=0.3)
    grid = _Keeping()
    strategy.start(grid, flat_to_arrays(flat, spec), 1, timeout=1.0)  # before: TypeError
    assert strategy.algorithm.round_num == 1
    request = TrainMessage.read(grid.sent[0])
    assert torch.equal(state_to_flat(request.state, spec), flat)
    assert P.ARRAYS_RECORD in grid.sent[0].content.array_records


# -- finding 4: what a model's attributes hold, set back before every user ----------------------


class _Remembering(torch.nn.Module):
    """A linear model of inputs minus a running mean kept in an attribute of kind ``kind``."""

    def __init__(self, model: torch.nn.Module, dim: int, kind: str) -> None:
        super().__init__()
        self.model, self.kind = model, kind
        self.stats = {
            "numpy": lambda: np.zeros(dim, dtype=np.float32),
            "bytearray": lambda: bytearray(4 * dim),
            "tuple": lambda: (torch.zeros(dim),),
            "namespace": lambda: types.SimpleNamespace(mean=torch.zeros(dim)),
            "deque": lambda: collections.deque([torch.zeros(dim)]),
            "ordered": lambda: collections.OrderedDict(last=torch.zeros(dim)),
            "generator": lambda: torch.Generator().manual_seed(0),
        }[kind]()

    def _seen(self, m: torch.Tensor) -> torch.Tensor:
        if self.kind == "numpy":
            self.stats += m.numpy()
            return torch.from_numpy(self.stats.copy())
        if self.kind == "bytearray":
            seen = np.frombuffer(self.stats, dtype=np.float32)
            seen += m.numpy()
            return torch.from_numpy(seen.copy())
        if self.kind == "tuple":
            return self.stats[0].add_(m).clone()
        if self.kind == "deque":
            self.stats.append(self.stats[-1] + m)
            return self.stats[-1]
        if self.kind == "ordered":
            self.stats[f"batch {len(self.stats)}"] = next(reversed(self.stats.values())) + m
            return next(reversed(self.stats.values()))
        if self.kind == "generator":  # a dropout of its own: one mask a batch
            return (torch.rand(m.shape, generator=self.stats) < 0.5).float()
        self.stats.mean = self.stats.mean + m
        return self.stats.mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seen = self._seen(x.detach().mean(0)) if self.training else torch.zeros(x.shape[1])
        return self.model(x - seen)


class _RememberingTask(MinimalTask):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def build_model(self) -> torch.nn.Module:
        return _Remembering(super().build_model(), self._dim, self.kind)


def last_update(task, users: list[int]) -> torch.Tensor:
    """The update of ``users``' last user, trained after the others on one ``LocalTrainer``."""
    config = LocalConfig(learning_rate=0.5, epochs=1, batch_size=4, clip_norm=10.0)
    trainer, start = LocalTrainer(task, device="cpu"), initial_flat(task)
    for user in users:
        result = trainer.train(start, user_id=user, round_num=1, config=config,
                               rngs=RngFactory(seed=0))  # fmt: skip
    return result.delta


@pytest.mark.parametrize(
    "kind", ["numpy", "bytearray", "tuple", "namespace", "deque", "ordered", "generator"]
)
def test_what_a_model_attribute_holds_is_set_back_before_every_user(kind) -> None:
    task = _RememberingTask(kind)
    assert torch.equal(last_update(task, [0, 1, 2, 3]), last_update(task, [3]))  # before: 0.59


# -- finding 6: what a ClientApp of one's own replies with ---------------------------------------


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"rejected": "3"}, "rejected"),
        ({"rejected": -1}, "rejected"),
        ({"rejected": 1.7}, "rejected"),
        ({"rejected": None}, "rejected"),
        ({"clip_bits": {1: None}}, r"clip_bits\[1\]"),
        ({"clip_bits": {1: float("nan")}}, r"clip_bits\[1\]"),
        ({"clip_bits": {1: "1"}}, r"clip_bits\[1\]"),
        ({"clip_bits": {1: torch.tensor([1.0, 0.0])}}, r"clip_bits\[1\]"),
    ],
)
def test_a_reply_s_counts_and_clip_bits_are_checked(extra, named) -> None:
    # a message asking for clip bits (forty-fourth review of issue 15, wire 2: a clip bit the
    # message does not ask for is refused, so this test's message without clip-bit now asks)
    local = LocalConfig(learning_rate=0.1, clip_norm=1.0, clip_bit=True, count_noise_std=0.1)
    settings = P.ClientSettings(local, seed=0)
    config = P.encode_train_config(users=[1], round_num=1, settings=settings)
    arrays = ArrayRecord({"w": torch.zeros(3)})
    message = delivered({P.CONFIG_RECORD: config, P.ARRAYS_RECORD: arrays}, "train")
    with pytest.raises(ValueError, match=named):
        reply_updates(message, {1: torch.zeros(3)}, **extra)  # before: sent
    reply = reply_updates(
        message, {1: torch.zeros(3)}, rejected=2, clip_bits={1: NoisedShare(-0.3, 0.1)}
    )
    assert reply.content[P.TRAIN_METRICS][P.USERS_REJECTED] == 2


# -- finding 7: wire.read_updates of an update record without its delta --------------------------


def test_read_updates_names_an_update_record_without_its_delta() -> None:
    good = ArrayRecord({P.DELTA_ARRAY: Array(np.zeros(2, dtype=np.float32))})
    content = RecordDict({"update/2": good, "update/1": ArrayRecord({"x": Array(np.zeros(2))})})
    with pytest.raises(ValueError, match=r"'update/1' \(user 1\) holds no array 'delta'"):
        P.read_updates(content)  # before: KeyError: 'delta'
    assert list(P.read_updates(RecordDict({"update/2": good}))) == [2]


# -- finding 8: what a ClientApp of one's own replies as an update -------------------------------


@pytest.mark.parametrize(
    "update",
    [
        np.zeros(3, dtype=np.float32),
        [0.0, 0.0, 0.0],
        None,
        torch.zeros(3, device="meta"),
        torch.zeros(3).to_sparse(),
        torch.ones(3, dtype=torch.complex64),
        torch.zeros(3, dtype=torch.int64),
    ],
    ids=["numpy", "list", "none", "meta", "sparse", "complex", "int64"],
)
def test_a_reply_s_update_must_be_a_dense_float_tensor(update) -> None:
    settings = P.ClientSettings(LocalConfig(learning_rate=0.1), seed=0)
    config = P.encode_train_config(users=[1], round_num=1, settings=settings)
    arrays = ArrayRecord({"w": torch.zeros(3)})
    message = delivered({P.CONFIG_RECORD: config, P.ARRAYS_RECORD: arrays}, "train")
    with pytest.raises(ValueError, match=r"updates\[1\] must be a user's flat update"):
        reply_updates(message, {1: update})
