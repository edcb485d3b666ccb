"""Issue 15, follow-up of the forty-second hostile review (privacy: today's privacy fixes).

1. Mechanisms 3's variant (the tag task's vectorized cohort trainer, ``TagCohortTrainer``,
   clipping each user's rows by ``clip_factor``'s product): a user whose norm lies within the
   measurement error of ``C`` (the Python API, ``train_batches`` of one user with ``clip_norm``
   the largest float below the update's exact norm; float32, what the engines pass, and
   float64). Before: the measured norm (``segment_norms_checked``, a float64 sum of squares)
   read at most ``C``, the factor was 1 and the update came back unclipped: 3 of 8 float32
   and 4 of 8 float64 users above C (by 1e-16 relative), where ``LocalTrainer``'s ``clip_l2``
   decides such a boundary exactly; a float64 update scaled by the factor (its 4-ulp margin
   does not cover the float64 norm's measurement error, ~5e-14 on a segment of 400,000 entries)
   exceeded C alike. Now ``TagCohortTrainer._clip`` clips by ``clip_l2`` a user whose measured
   norm is not certainly inside ``C`` (``norm_error_bound``) and every scaled user of a dtype
   other than float32 (whose margin covers the measurement): exact norm at most C; a float32
   user clearly inside or outside the ball is scaled as before, bit for bit.
2. Mechanisms 2's variant (the count folded into the PLD paths): ``pld_guard.pld_grid_points``
   (public: the grid a PLD of one event holds, "before anything is allocated") of an
   adaptive-clipping event. Before: the points of the sum's ``noise_multiplier`` alone, 28,590
   for ``poisson(sample_rate=0.1, noise_multiplier=2, count_noise_multiplier=1.2)`` where the
   PLD ``pld_epsilon`` builds for it (its single Gaussian) has 77,465 (q 1, sigma 0.5, count
   0.05: 429,821 for 7,957,635), and a fixed-size event (which the PLD accountant refuses) got
   a number. Now the event goes through ``pld_guard.poisson_gaussians`` as in ``pld_epsilon``
   and ``check_pld_ledger``: the single Gaussian's points, fixed and tree events refused with
   its message; events without a count unchanged.
3. Api 2's variant (a task's builds sharing state with the model the run evaluates): a task
   whose ``build_model()`` builds fresh modules that all hold one feature-mean tensor it keeps,
   as a non-persistent buffer or a plain tensor attribute, which the forward sets from the
   minibatch in training and reads in evaluation (``simulate toy.toml --rounds 2 --set
   task=sharedbuf42:shared``). Before: api 2's check compares modules only and took it; the
   trainer left the last trained user's minibatch mean in the tensor, which every evaluation
   read: ``eval_accuracy`` 0.4567 where a task building a new tensor each time gives 0.5967
   for the same released model (rc 0), a reported number depending on one user's data without
   noise. Now ``LocalTrainer.train`` sets the model back to its build (``ModelAtBuild.restore``)
   after each user as well as before: the evaluated model reads the build's values (0.5967).
   Edited on purpose: ``test_thirtyfourth_review_tasks::test_6`` (its trainer held user 3's
   running mean until the next load; now none).
4. Api 4's variant (``privatize_update`` given an update the server could not measure): a
   plain tensor whose instance carries its own ``detach`` (``update.detach = lambda:
   torch.zeros(100)``; entries 100, norm 1000, C 1). Before: ``clip_l2`` measured it through
   that ``detach``: norm 0.0, ``clipped`` False, the vector of norm 1000 returned as it came
   (noised: 1000.2). Now ``privatize_update`` works on ``torch.Tensor.detach(update)`` (a plain
   alias, no copy): clipped to norm at most C, the norm 1000 reported.
5. Api 1's variant (a round that is no plain ``int``), in the draw: ``users =
   alg.sample(r)`` with ``r`` an ``int`` subclass equal to every number, ``alg.aggregate(1,
   updates, cohort=users)``, then ``alg.aggregate(2, updates, cohort=users)`` (secure mode, and
   tree aggregation with restart 4). Before: the draw was kept under ``r``, which read as
   round 2 too: round 1's cohort was summed again for round 2 (accepted 9 and 10), charged as
   an independent sample (secure epsilon 10.28) or, under the tree, as a second round of the
   period in which every user takes part once. Now ``ServerAlgorithm.sample`` keeps the draw
   under the round's plain ``int`` (``check_int``): round 2 is refused (``... drew for it
   last``), nothing charged.
6. Api 3's variant (a state's tensors without dense values), in the optimizer state:
   ``other.load_state_dict(state)`` of a dp-fedadam state whose ``opt_state`` ``mu`` or ``nu``
   is sparse (``to_sparse()``) or on the meta device. Before: a sparse ``mu`` was taken and the
   next round ended in torch's ``NotImplementedError`` (``aten::lerp.Scalar`` on SparseCPU)
   after its noised sum was computed, the algorithm stuck at round 1; the others raised
   torch's ``NotImplementedError`` or ``RuntimeError`` naming no key. Now
   ``AlgorithmState.load_state_dict`` refuses each naming it (``checkpoint's optimizer state mu
   must be a dense tensor with values: ...``), the algorithm as it was.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from fedprivopt.clients import LocalConfig, LocalTrainer, privatize_update
from fedprivopt.models import initial_flat
from fedprivopt.models.toy import ToyClassificationTask
from fedprivopt.privacy import RngFactory, SubsampledGaussianEvent
from fedprivopt.privacy.pld_guard import pld_grid_points
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.tag_synth import make_synth_dir, tag_task


def _exact_sq(vector: torch.Tensor) -> Fraction:
    return sum((Fraction(x) ** 2 for x in vector.double().flatten().tolist() if x), Fraction(0))


def _below(exact_sq: Fraction) -> float:
    """The largest float whose square is below ``exact_sq`` (a norm just inside the update's)."""
    c = math.sqrt(exact_sq)
    while Fraction(c) ** 2 >= exact_sq:
        c = math.nextafter(c, 0.0)
    return c


# -- finding 1: the vectorized tag trainer at the boundary of the ball --------------------------


@pytest.fixture(scope="module")
def tag_dir(tmp_path_factory):
    return make_synth_dir(tmp_path_factory, "r42-followup-privacy-tag")


def _trained(trainer, w, users, clip_norm):
    cfg = LocalConfig(learning_rate=0.5, epochs=1, batch_size=8, clip_norm=clip_norm)
    batches = trainer.train_batches(w, users, round_num=1, config=cfg, rngs=RngFactory(seed=0))
    return dict(pair for batch in batches for pair in batch.split())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_1_vectorized_tag_clip_at_the_boundary(tag_dir, dtype):
    task = tag_task(tag_dir)
    trainer = task.cohort_trainer(device="cpu")
    w = initial_flat(task).to(dtype)
    users = list(range(8))
    free = _trained(trainer, w, users, None)
    above = []
    for user in users:
        exact = _exact_sq(free[user].values)
        clip_norm = _below(exact)  # the update's exact norm is above C by less than an ulp
        got = _trained(trainer, w, [user], clip_norm)[user]
        if _exact_sq(got.values) > Fraction(clip_norm) ** 2:
            above.append(user)  # was: unclipped (the measured norm read at most C)
    assert above == []
    # users clearly outside the ball: float32 scaled as before, exact norm at most C
    got = _trained(trainer, w, users, 0.05)
    assert all(_exact_sq(u.values) <= Fraction(0.05) ** 2 for u in got.values())


# -- finding 2: pld_grid_points of an adaptive-clipping event ----------------------------------


def test_2_pld_grid_points_counts_the_single_gaussian():
    for q, sigma, count in ((0.1, 2.0, 1.2), (1.0, 0.5, 0.05)):
        event = SubsampledGaussianEvent.poisson(
            sample_rate=q, noise_multiplier=sigma, count_noise_multiplier=count
        )
        plain = SubsampledGaussianEvent.poisson(sample_rate=q, noise_multiplier=sigma)
        # was pld_grid_points(plain): 28,590 and 429,821 where the PLD holds 77,465 and 7,957,635
        assert pld_grid_points(event) == pld_grid_points(event.single_gaussian())
        assert pld_grid_points(event) > 2 * pld_grid_points(plain)
    fixed = SubsampledGaussianEvent.fixed(population=100, cohort_size=10, noise_multiplier=2.0)
    with pytest.raises(ValueError, match="supports only Poisson"):
        pld_grid_points(fixed)  # was 80,488 points


# -- finding 3: a tensor the task shares between the models it builds ---------------------------


class _Centered(torch.nn.Module):
    """A linear model of centred features; the forward keeps its minibatch's feature mean."""

    def __init__(self, linear: torch.nn.Module, mean: torch.Tensor, *, as_buffer: bool):
        super().__init__()
        self.linear = linear
        if as_buffer:
            self.register_buffer("mean", mean, persistent=False)
        else:
            self.mean = mean  # a plain tensor attribute

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.mean.copy_(x.mean(0))
        return self.linear(x - self.mean)


class _SharedMeanTask(ToyClassificationTask):
    """The toy task whose every model (fresh modules) holds one feature-mean tensor it keeps."""

    def __init__(self, as_buffer: bool, **params):
        super().__init__(**params)
        self.as_buffer, self.mean = as_buffer, None

    def build_model(self):
        if self.mean is None:
            self.mean = torch.zeros(self.dim)
        return _Centered(super().build_model(), self.mean, as_buffer=self.as_buffer)


@pytest.mark.parametrize("as_buffer", [True, False], ids=["buffer", "attribute"])
def test_3_a_tensor_shared_by_fresh_models_is_left_as_built(as_buffer):
    task = _SharedMeanTask(as_buffer, num_users=4)
    trainer = LocalTrainer(task, device="cpu")  # fresh modules: api 2's check takes it
    cfg = LocalConfig(learning_rate=0.1, epochs=1, batch_size=4, clip_norm=1.0)
    trainer.train(initial_flat(task), user_id=1, round_num=1, config=cfg, rngs=RngFactory(seed=0))
    evaluated = task.build_model()  # what the run evaluates the released model with
    assert torch.equal(evaluated.mean, torch.zeros(task.dim))  # was user 1's last minibatch mean


# -- finding 4: privatize_update of a plain tensor carrying its own detach ----------------------


def test_4_privatize_update_measures_the_tensor_not_its_own_detach():
    update = torch.full((100,), 100.0)  # norm 1000
    update.detach = lambda: torch.zeros(100)  # an instance attribute (a wrapper library's)
    out = privatize_update(update, clip_norm=1.0)
    # was: norm 0.0, clipped False, the vector of norm 1000 returned as it came
    assert out.clipped and out.norm == pytest.approx(1000.0)
    assert _exact_sq(out.vector) <= 1
    noised = privatize_update(
        update, clip_norm=1.0, noise_std=0.5, generator=torch.Generator().manual_seed(0)
    )
    assert float(torch.linalg.vector_norm(noised.vector)) < 10  # was 1000.2


# -- finding 5: a secure or tree draw kept under a round that is no plain int -------------------


class _EqualToAll(int):
    """An int equal to every number (so any round reads as the round of its draw)."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


def _algorithm(**changes):
    values = {"strategy": "dp-fedavg", "population": 40, "clients-per-round": 10,
              "num-server-rounds": 5, "noise-multiplier": 0.5, "delta": 1e-4, "seed": 0,
              **changes}  # fmt: skip
    return build_algorithm(StrategyConfig.from_mapping(values), torch.zeros(4))


@pytest.mark.parametrize(
    "changes",
    [{"secure": True}, {"noise-mechanism": "tree", "tree-restart-rounds": 4}],
    ids=["secure", "tree"],
)
def test_5_a_draw_is_kept_under_its_plain_round(changes):
    alg = _algorithm(**changes)
    users = alg.sample(_EqualToAll(1))
    updates = {u: torch.full((4,), 0.1) for u in range(40)}
    alg.aggregate(1, updates, cohort=users)
    events = alg.accountant.num_events
    with pytest.raises(ValueError, match="drew for it last"):
        alg.aggregate(2, updates, cohort=users)  # was: round 1's cohort summed again, charged
    assert alg.accountant.num_events == events


# -- finding 6: an optimizer moment without dense values ---------------------------------------


def _same_update(request):
    return {u: torch.full((4,), 0.1) for u in request.users}


@pytest.mark.parametrize("key", ["mu", "nu"])
@pytest.mark.parametrize("form", ["sparse", "meta"])
def test_6_an_optimizer_moment_without_dense_values_is_refused_naming_it(key, form):
    alg = _algorithm(strategy="dp-fedadam")
    drive_round(alg, 1, _same_update)
    state = alg.state_dict()
    moments = dict(state["opt_state"])
    moments[key] = moments[key].to_sparse() if form == "sparse" else torch.empty(4, device="meta")
    other = _algorithm(strategy="dp-fedadam")
    with pytest.raises(ValueError, match=rf"checkpoint's optimizer state {key} must be a dense"):
        other.load_state_dict({**state, "opt_state": moments})  # mu sparse was taken
    assert other.round_num == 0
    other.load_state_dict(state)
    drive_round(other, 2, _same_update)
    assert other.round_num == 2
