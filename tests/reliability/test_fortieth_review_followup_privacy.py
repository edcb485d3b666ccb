"""Issue 15, follow-up of the fortieth hostile review (privacy: the api and mechanisms fixes).

1. The meta device given to the aggregator, the noise, the generators and the tree (the open row
   of the fortieth review's mechanisms reviewer): ``NoisyMeanAggregator(clip_norm=1,
   noise_multiplier=1, expected_cohort_size=1).aggregate([(0, 0.1 * torch.ones(3))], dim=3,
   generator=g, device="meta")``, ``gaussian_noise(3, 1.0, generator=g, device="meta")``,
   ``TreeNoise(..., device="meta")``; ``"mps"`` and ``"xla"`` on a machine without them.
   Before: meta was taken (the honest update rejected as "contains NaN or Inf", a release of no
   numbers returned with ``noise_std`` 1.0; noise without values); mps and xla ended in torch's
   ``NotImplementedError`` naming no parameter. Now ``core.devices.check_device`` refuses the
   meta device and a device type torch cannot allocate on here, ``ValueError`` naming
   ``device``; CPU and CUDA as before.
2. ``privatize_update(torch.tensor([0.1], dtype=torch.float64), clip_norm=Fraction(1, 10))``
   (also ``2**54 - 1`` with ``[2.0**54]``, ``numpy.longdouble(1) - 2**-60`` with ``[1.0]``): the
   client's twin of the fortieth review's mechanisms 1 (the open row of its reviewer). Before:
   ``check_real`` read C as the nearest float, above it, so the update was returned unclipped
   (``clipped`` False) with exact norm above C. Now ``privatize_update`` reads it as the largest
   float not above it, as ``clip_l2`` does: clipped, exact norm at most C; a float C as before.
3. The fortieth review's api 6 in secure mode and under tree aggregation:
   ``alg.sample(1)`` (10 of 40 users), then ``alg.aggregate(1, updates, cohort=list(range(40)))``
   (dp-fedavg, population 40, q 0.25, seed 1). Before: api 6 checked a given cohort against the
   round's sample only in seeded sampled mode, so all 40 were summed (accepted 40) under the
   charge of a round sampling a quarter (secure: epsilon 8.71), and under tree aggregation 30
   users the participation ledger never checked in could be sampled again in the period. Now
   ``ServerAlgorithm.sample`` keeps the last cohort it drew (by purpose) and ``_round_cohort``
   refuses a cohort outside it, or a round it drew none for, before anything is drawn; the
   cohort it drew as before.
4. The fortieth review's api 2 under tree aggregation (restart 3, seeded and secure): ``s1 =
   alg.state_dict()`` after round 1, rounds 2 and 3 driven, ``alg.load_state_dict(s1)``, round 2
   driven again with other updates. Before: taken (a period is charged at its first round, so
   s1 held as many events, 1, as the algorithm): seeded, the two round-2 releases differed by
   the updates' difference exactly (0.2 in every entry: the same tree noise), and round 2's
   users took part twice in the period; epsilon stayed 15.01. Now
   ``AlgorithmState._refuse_fewer_events`` also refuses, in a private algorithm that released
   rounds, a state of an earlier round; the same round (or a new algorithm) as before.
5. The fortieth review's mechanisms 5 with a model's own NumPy or Python generator
   (``np.random.default_rng(0)``, ``np.random.RandomState(0)``, ``random.Random(0)``: a dropout
   mask a batch), ``LocalTrainer.train`` of users 0-3 on one trainer. Before: only a
   ``torch.Generator`` was set back: user 3's update after users 0-2 differed from its own by
   0.16, 0.30 and 0.22 in an entry. Now ``ModelAtBuild`` sets their states back
   (``model_layout._RANDOM``): the same update to the bit.
6. The fortieth review's mechanisms 4 with a Python ``array.array`` attribute holding a running
   mean. Before: not set back (user 3's update after users 0-2 differed from its own). Now set
   back as a ``bytearray`` is.
7. The fortieth review's api 8 in every other path: ``drive_round(alg, 1, train)`` in
   distributed-noise mode (dp-fedavg, sigma 1, C 1, population 40, 10 a round, ``m_min`` 4, a
   model of 1,000 entries) whose callback returns the users' updates without their noise shares
   (as a ClientApp of one's own under Flower or a deployment that sends the clipped update, not
   ``PrivateUpdate.vector``). Before: accepted 9 as shares, no top-up: the released model held
   no noise at all (std 0.0 about its mean), reported ``noise_std`` 0.15, epsilon 2.53. Now
   ``NoisyMeanAggregator`` rejects a dense update below ``share_floor`` (Laurent and Massart's
   e^-50 bound, as api 8's): rejected 9, topped up in full (``topup_std`` 1.0); honest runs
   the same to the bit.
"""

from __future__ import annotations

import array
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from fedprivopt.clients.privatize import privatize_update
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.privacy.noise import gaussian_noise
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.tree import TreeNoise
from fedprivopt.strategies import StrategyConfig, build_algorithm
from tests.models.minimal_task import MinimalTask
from tests.reliability.test_fortieth_review_mechanisms import last_update


def _aggregate(device):
    agg = NoisyMeanAggregator(clip_norm=1, noise_multiplier=1, expected_cohort_size=1)
    g = torch.Generator().manual_seed(0)
    return agg.aggregate([(0, 0.1 * torch.ones(3))], dim=3, generator=g, device=device)


def _noise(device):
    return gaussian_noise(3, 1.0, generator=torch.Generator().manual_seed(0), device=device)


def _tree(device):
    return TreeNoise(std=1.0, restart_rounds=2, rngs=RngFactory(seed=0), dim=3, device=device)


def _generator(device):
    return RngFactory(seed=0).generator(1, "sampling", device=device)


@pytest.mark.parametrize("device", ["meta", "mps", "xla"])
@pytest.mark.parametrize("call", [_aggregate, _noise, _tree, _generator])
def test_1_a_device_without_data_or_not_here_is_refused(call, device):
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has mps")
    with pytest.raises(ValueError, match="device"):
        call(device)


@pytest.mark.parametrize("call", [_aggregate, _noise, _tree, _generator])
def test_1_cpu_as_before(call):
    call("cpu")
    call(torch.device("cpu"))


@pytest.mark.parametrize(
    ("vector", "clip_norm"),
    [
        ([0.1], Fraction(1, 10)),
        ([2.0**54], 2**54 - 1),
        ([1.0], np.longdouble(1) - np.longdouble(2) ** -60),
    ],
)
def test_2_privatize_reads_c_as_the_float_not_above_it(vector, clip_norm):
    out = privatize_update(torch.tensor(vector, dtype=torch.float64), clip_norm=clip_norm)
    assert out.clipped
    norm = float(torch.linalg.vector_norm(out.vector))
    exact = clip_norm if isinstance(clip_norm, np.floating) else Fraction(clip_norm)
    assert (np.longdouble(norm) if isinstance(exact, np.floating) else Fraction(norm)) <= exact


def test_2_float_c_as_before():
    out = privatize_update(torch.tensor([3.0, 4.0]), clip_norm=1.0)
    assert (out.norm, out.clipped) == (5.0, True)
    assert float(out.vector.norm()) == pytest.approx(1.0)
    out = privatize_update(torch.tensor([0.3, 0.4]), clip_norm=1.0)
    assert not out.clipped
    with pytest.raises(ValueError, match="clip_norm must be None or a finite number > 0"):
        privatize_update(torch.tensor([1.0]), clip_norm=Fraction(1, 10**400))


def _algorithm(**kw):
    cfg = StrategyConfig(
        strategy="dp-fedavg", population=40, clients_per_round=10, num_server_rounds=3,
        noise_multiplier=0.5, clip_norm=1.0, seed=1, **kw,
    )  # fmt: skip
    return build_algorithm(cfg, torch.zeros(10))


MODES = [{"secure": True}, {"noise_mechanism": "tree"}]


@pytest.mark.parametrize("kw", MODES)
def test_3_a_cohort_beyond_the_draw_is_refused(kw):
    alg = _algorithm(**kw)
    alg.sample(1)
    updates = {u: torch.full((10,), 0.1) for u in range(40)}
    with pytest.raises(ValueError, match="did not sample"):
        alg.aggregate(1, updates, cohort=list(range(40)))
    assert alg.epsilon() == 0.0  # nothing drawn, nothing charged


@pytest.mark.parametrize("kw", MODES)
def test_3_a_round_without_a_draw_is_refused(kw):
    alg = _algorithm(**kw)
    users = alg.sample(1)
    with pytest.raises(ValueError, match="drew none"):
        alg.aggregate(2, {u: torch.full((10,), 0.1) for u in users}, cohort=users)


@pytest.mark.parametrize("kw", MODES)
def test_3_the_drawn_cohort_as_before(kw):
    alg = _algorithm(**kw)
    users = alg.sample(1)
    agg = alg.aggregate(1, {u: torch.full((10,), 0.1) for u in users}, cohort=users)
    assert agg.metrics["accepted"] == len(users)
    users2 = alg.sample(2)  # a part of the drawn cohort (a user dropped out)
    agg = alg.aggregate(2, {u: torch.full((10,), 0.1) for u in users2[:2]}, cohort=users2[:2])
    assert agg.metrics["accepted"] == 2


@pytest.mark.parametrize("secure", [False, True])
def test_4_an_earlier_state_of_the_tree_period_is_refused(secure):
    from fedprivopt.strategies.core import drive_round

    alg = _algorithm(noise_mechanism="tree", tree_restart_rounds=3, secure=secure)

    def train(request):
        return {u: torch.full((10,), 0.1) for u in request.users}

    drive_round(alg, 1, train)
    s1 = alg.state_dict()
    drive_round(alg, 2, train)
    drive_round(alg, 3, train)
    s3, params = alg.state_dict(), alg.params.clone()
    with pytest.raises(ValueError, match="released rounds up to 3, the state is of round 1"):
        alg.load_state_dict(s1)
    assert alg.round_num == 3 and torch.equal(alg.params, params)
    alg.load_state_dict(s3)  # the same round: taken
    fresh = _algorithm(noise_mechanism="tree", tree_restart_rounds=3, secure=secure)
    fresh.load_state_dict(s1)  # into a new algorithm: taken
    drive_round(fresh, 2, train)


class _RandomDropout(torch.nn.Module):
    """A linear model whose training forward drops inputs by a random generator of its own."""

    def __init__(self, model: torch.nn.Module, kind: str) -> None:
        super().__init__()
        self.model, self.kind = model, kind
        self.rng = {
            "numpy-generator": lambda: np.random.default_rng(0),
            "numpy-randomstate": lambda: np.random.RandomState(0),
            "python-random": lambda: random.Random(0),
        }[kind]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:  # one mask a batch: the state after users 0-2 counts their batches
            if self.kind == "python-random":
                mask = torch.tensor([self.rng.random() < 0.5 for _ in range(x.shape[1])])
            else:
                mask = torch.from_numpy(self.rng.random(x.shape[1]) < 0.5)
            x = x * mask.float()
        return self.model(x)


class _RandomDropoutTask(MinimalTask):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def build_model(self) -> torch.nn.Module:
        return _RandomDropout(super().build_model(), self.kind)


@pytest.mark.parametrize("kind", ["numpy-generator", "numpy-randomstate", "python-random"])
def test_5_a_model_s_own_numpy_or_python_generator_is_set_back(kind):
    task = _RandomDropoutTask(kind)
    assert torch.equal(last_update(task, [0, 1, 2, 3]), last_update(task, [3]))


class _ArrayStats(torch.nn.Module):
    """A linear model of inputs minus a running mean kept in an ``array.array`` attribute."""

    def __init__(self, model: torch.nn.Module, dim: int) -> None:
        super().__init__()
        self.model, self.stats = model, array.array("f", [0.0] * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            seen = np.frombuffer(self.stats, dtype=np.float32)
            seen += x.detach().mean(0).numpy()
            x = x - torch.from_numpy(seen.copy())
        return self.model(x)


class _ArrayStatsTask(MinimalTask):
    def build_model(self) -> torch.nn.Module:
        return _ArrayStats(super().build_model(), self._dim)


def test_6_an_array_array_attribute_is_set_back():
    task = _ArrayStatsTask()
    assert torch.equal(last_update(task, [0, 1, 2, 3]), last_update(task, [3]))


def test_7_a_distributed_update_without_its_share_is_rejected():
    from fedprivopt.strategies.core import drive_round

    cfg = StrategyConfig.from_mapping({
        "strategy": "dp-fedavg", "population": 40, "clients-per-round": 10,
        "num-server-rounds": 3, "noise-multiplier": 1.0, "clip-norm": 1.0, "delta": 1e-4,
        "seed": 0, "noise-mode": "distributed",
    })  # fmt: skip
    alg = build_algorithm(cfg, torch.zeros(1000))
    result = drive_round(alg, 1, lambda req: {u: torch.full((1000,), 0.01) for u in req.users})
    assert result.metrics["accepted"] == 0 and result.metrics["topup_std"] == 1.0
    assert float(alg.params.std()) > 0.05  # before: 0.0, the sum released without noise

    g = torch.Generator().manual_seed(0)
    share = alg.aggregator.share_std()
    honest = {u: torch.full((1000,), 0.01) + share * torch.randn(1000, generator=g)
              for u in alg.sample(2)}  # fmt: skip
    result = drive_round(alg, 2, lambda req: {u: honest[u] for u in req.users})
    assert result.metrics["rejected"] == 0 and result.metrics["topup_std"] == 0.0
