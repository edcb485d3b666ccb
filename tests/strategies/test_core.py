import math
import random

import numpy as np
import pytest
import torch

from fedprivopt.privacy import compose_epsilon, make_round_event
from fedprivopt.privacy.aggregate import NoisyMeanAggregator
from fedprivopt.strategies import STRATEGIES, StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round

DIM = 50


def config(**kw):
    base = dict(
        strategy="dp-fedavg",
        population=40,
        clients_per_round=8,
        noise_multiplier=1.0,
        clip_norm=1.0,
        seed=3,
        num_server_rounds=5,
    )
    base.update(kw)
    return StrategyConfig.from_mapping(base)


def fixed_updates(scale=0.3):
    """Deterministic per-user updates that depend only on (user, stream)."""

    def train(request):
        out = {}
        for u in request.users:
            g = torch.Generator().manual_seed(1000 * u + len(request.stream))
            out[u] = torch.randn(DIM, generator=g) * scale
        return out

    return train


def make(strategy="dp-fedavg", **kw):
    side = torch.full((DIM,), 2.0) if strategy == "adadps" else None
    return build_algorithm(config(strategy=strategy, **kw), torch.zeros(DIM), preconditioner=side)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_runs_rounds_and_accounts(strategy):
    alg = make(strategy)
    for r in range(1, 4):
        res = drive_round(alg, r, fixed_updates())
        assert res.params.shape == (DIM,) and res.params.dtype == torch.float32
        assert torch.isfinite(res.params).all()
    if alg.config.private:
        k = 2 if strategy == "dp-fedavg-adadp" else 1
        ev = make_round_event(1.0, sample_rate=8 / 40)
        assert alg.epsilon() == compose_epsilon([(ev, 3 * k)], 1e-5)
        assert alg.accountant.num_events == 3 * k
    else:
        assert math.isinf(alg.epsilon())


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s not in ("fedavg", "fedadam")])
def test_frozen_coordinates_keep_their_value_and_the_rest_is_unchanged(strategy):
    frozen = torch.zeros(DIM, dtype=torch.bool)
    frozen[-7:] = True
    side = torch.full((DIM,), 2.0) if strategy == "adadps" else None
    init = torch.linspace(-1.0, 1.0, DIM)

    def train(request):  # clients never change frozen parameters (LocalTrainer's rule)
        return {u: d.masked_fill(frozen, 0.0) for u, d in fixed_updates()(request).items()}

    free = build_algorithm(config(strategy=strategy), init, preconditioner=side)
    held = build_algorithm(config(strategy=strategy), init, preconditioner=side, frozen=frozen)
    for r in range(1, 4):
        a, b = drive_round(free, r, train), drive_round(held, r, train)
    assert torch.equal(b.params[-7:], init[-7:])  # the noise there was dropped
    assert not torch.equal(a.params[-7:], init[-7:])  # without the mask it moves them
    if strategy in ("dp-fedavg", "adadps"):  # coordinate-wise optimizers: the rest is identical
        torch.testing.assert_close(b.params[:-7], a.params[:-7], rtol=0, atol=0)
    assert held.epsilon() == free.epsilon()


@pytest.mark.parametrize("bad", [torch.zeros(DIM), torch.zeros(DIM + 1, dtype=torch.bool)])
def test_a_frozen_mask_of_the_wrong_kind_is_refused(bad):
    with pytest.raises(ValueError, match="frozen must be a boolean vector of the model's length"):
        build_algorithm(config(), torch.zeros(DIM), frozen=bad)


def test_sensitivity_of_the_pre_noise_sum():
    """Adding or removing one user moves the sum by at most C (Poisson, add/remove-one);
    replacing one user's data arbitrarily moves it by at most 2C (fixed-size, replace-one)."""
    c, m_bar = 1.5, 5.0
    agg = NoisyMeanAggregator(clip_norm=c, noise_multiplier=0.7, expected_cohort_size=m_bar)
    gen = torch.Generator().manual_seed(0)
    honest = {u: torch.randn(DIM, generator=gen) for u in range(6)}

    def pre_noise_sum(updates):  # same noise seed, so differences are differences of sums
        res = agg.aggregate(updates.items(), dim=DIM, generator=torch.Generator().manual_seed(9))
        return res.delta_tilde.double() * m_bar

    base = pre_noise_sum(honest)
    hostile_values = [
        torch.randn(DIM, generator=gen) * 1e6,
        torch.zeros(DIM),
        -honest[2] * 100,
        torch.full((DIM,), 1e30),
    ]
    for hostile in hostile_values:
        added = pre_noise_sum({**honest, 99: hostile})
        assert float(torch.linalg.vector_norm(added - base)) <= c * (1 + 1e-5)
        replaced = pre_noise_sum({**honest, 2: hostile})
        assert float(torch.linalg.vector_norm(replaced - base)) <= 2 * c * (1 + 1e-5)
    removed = pre_noise_sum({u: v for u, v in honest.items() if u != 2})
    assert float(torch.linalg.vector_norm(removed - base)) <= c * (1 + 1e-5)


@pytest.mark.parametrize("mode", ["server", "distributed"])
@pytest.mark.parametrize("arrived", [12, 5])
def test_noise_on_the_mean_has_std_sigma_c_over_m_bar(mode, arrived):
    sigma, c, m_bar, m_min, dim = 0.8, 2.0, 10.0, 8, 200_000
    agg = NoisyMeanAggregator(
        clip_norm=c,
        noise_multiplier=sigma,
        expected_cohort_size=m_bar,
        noise_mode=mode,
        min_shares=m_min if mode == "distributed" else None,
    )
    gen = torch.Generator().manual_seed(1)
    share = agg.share_std()
    assert share == (sigma * c / math.sqrt(m_min) if mode == "distributed" else 0.0)
    fixed = torch.full((dim,), 0.001)  # the same (tiny) clipped update from every client
    updates = [(u, fixed + torch.randn(dim, generator=gen) * share) for u in range(arrived)]
    res = agg.aggregate(updates, dim=dim, generator=torch.Generator().manual_seed(2))
    noise = res.delta_tilde - fixed * arrived / m_bar
    expected = sigma * c / m_bar
    if mode == "distributed":
        expected *= math.sqrt(max(arrived, m_min) / m_min)
    assert float(noise.std()) == pytest.approx(expected, rel=0.05)
    assert res.noise_std == pytest.approx(expected, rel=1e-9)
    assert float(noise.std()) >= sigma * c / m_bar * 0.95  # never less than accounted


def test_malformed_updates_are_rejected_or_reclipped_and_counted():
    alg = make(clip_norm=1.0)

    def hostile(request):
        users = request.users
        out = {u: torch.ones(DIM) * 0.01 for u in users}
        bad = [
            torch.full((DIM,), float("nan")),
            torch.ones(DIM + 1),
            torch.ones(DIM).double(),
            None,
            torch.full((DIM,), float("inf")),
            torch.ones(DIM) * 1e9,
        ]
        for u, b in zip(users, bad, strict=False):
            out[u] = b
        return out

    res = drive_round(alg, 1, hostile)
    n = int(res.metrics["cohort_size"])
    assert n >= 6
    assert res.metrics["rejected"] == 5 and res.metrics["accepted"] == n - 5
    assert res.metrics["server_clipped"] == 1
    reasons = sorted(res.rejected.values())
    assert any("NaN or Inf" in r for r in reasons) and any("shape" in r for r in reasons)
    assert any("dtype" in r for r in reasons) and any("not a tensor" in r for r in reasons)
    assert torch.isfinite(res.params).all()


def test_hostile_update_moves_the_model_by_at_most_c_over_m_bar():
    honest, hostile = make(noise_multiplier=1.0), make(noise_multiplier=1.0)

    def with_attacker(request):
        out = fixed_updates()(request)
        out[request.users[0]] = torch.full((DIM,), 1e12)
        return out

    a = drive_round(honest, 1, fixed_updates()).params
    b = drive_round(hostile, 1, with_attacker).params
    assert float(torch.linalg.vector_norm((a - b).double())) <= 2 * 1.0 / 8 * (1 + 1e-5)


def test_same_seed_same_model_and_global_rng_changes_nothing():
    finals = []
    for s in (0, 1):
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)
        alg = make("dp-fedadam")
        for r in range(1, 4):
            drive_round(alg, r, fixed_updates())
        finals.append(alg.params)
    assert torch.equal(finals[0], finals[1])
    other = make("dp-fedadam", seed=4)
    for r in range(1, 4):
        drive_round(other, r, fixed_updates())
    assert not torch.equal(finals[0], other.params)


def test_budget_stops_before_exceeding_the_target():
    alg = make(target_epsilon=2.0, clients_per_round=8, noise_multiplier=3.0)
    rounds = 0
    while alg.budget_allows_next_round():
        rounds += 1
        drive_round(alg, rounds, fixed_updates())
    assert rounds > 2 and alg.epsilon() <= 2.0
    assert alg.accountant.epsilon_after(alg.round_events(), 1e-5) > 2.0


def test_adadps_broadcasts_side_information_every_round():
    alg = make("adadps")
    seen = []

    def train(request):
        seen.append(request.preconditioner)
        return fixed_updates()(request)

    for r in (1, 2):
        drive_round(alg, r, train)
    assert all(p is not None and torch.equal(p, torch.full((DIM,), 2.0)) for p in seen)
    with pytest.raises(ValueError, match="side information"):
        build_algorithm(config(strategy="adadps"), torch.zeros(DIM))
    with pytest.raises(ValueError, match="positive"):
        build_algorithm(
            config(strategy="adadps"), torch.zeros(DIM), preconditioner=torch.zeros(DIM)
        )


@pytest.mark.parametrize("strategy", ["dp2", "dp2-noise-first"])
def test_dp2_preconditioner_reaches_clients_only_in_adaptive_rounds(strategy):
    alg = make(strategy, dp2_s1=2, dp2_s2=3, clip_norm_adaptive=0.5)
    seen = []

    def train(request):
        seen.append((request.preconditioner, request.settings.local.clip_norm))
        return fixed_updates()(request)

    for r in range(1, 11):
        res = drive_round(alg, r, train)
        assert res.metrics["adaptive_round"] == float(((r - 1) % 5) >= 2)
    adaptive = [((r - 1) % 5) >= 2 for r in range(1, 11)]
    for (p, clip), is_adaptive in zip(seen, adaptive, strict=True):
        assert clip == (0.5 if is_adaptive else 1.0)
        if strategy == "dp2" and is_adaptive:
            assert p is not None and p.shape == (DIM,) and bool((p > 0).all())
        else:
            assert p is None


def test_dp2_scale_by_preconditioner_reaches_the_transform_and_metrics():
    plain = make("dp2", dp2_s1=1, dp2_s2=2)
    scaled = make("dp2", dp2_s1=1, dp2_s2=2, dp2_scale_by_preconditioner=True)
    assert scaled.transform.hparams["scale_by_preconditioner"] is True
    assert plain.transform.hparams["scale_by_preconditioner"] is False
    steps = []
    for alg in (plain, scaled):
        drive_round(alg, 1, fixed_updates())
        before = alg.params.clone()
        res = drive_round(alg, 2, fixed_updates())  # the first adaptive round
        assert res.metrics["adaptive_round"] == 1.0
        mean_p = res.metrics["dp2_preconditioner_mean"]
        steps.append(alg.params - before)
    assert mean_p == pytest.approx(float(scaled.opt_state.preconditioner.mean()))
    # same seeds, same noise: the scaled step is the plain one divided by mean(P)
    torch.testing.assert_close(steps[1], steps[0] / mean_p)


def test_dp2_noise_first_reports_the_share_of_coordinates_its_bound_caps():
    """Stage 12: a noise-first adaptive round with max-noise-step caps eta/P_i at kappa/std.

    A twin without the bound sees the same noised means (the updates do not depend on the
    model, the noise on the seed), so its step divided by eta/P is the noised mean.
    """
    kappa, std = 0.4, 1.0 * 1.0 / 8  # sigma C / m: the noise std of the noised mean
    bounded = make("dp2-noise-first", dp2_s1=1, dp2_s2=2, max_noise_step=kappa)
    free = make("dp2-noise-first", dp2_s1=1, dp2_s2=2)
    steps = []
    for alg in (bounded, free):
        res = drive_round(alg, 1, fixed_updates())  # the SGD round
        assert "dp2_capped_fraction" not in res.metrics
        p, before = alg.opt_state.preconditioner.clone(), alg.params.clone()
        res = drive_round(alg, 2, fixed_updates())  # the first adaptive round
        assert "server_learning_rate" not in res.metrics
        steps.append((alg.params - before, res.metrics))
    lr = bounded.config.options.dp2_learning_rate
    capped = p < lr * std / kappa
    assert 0 < int(capped.sum()) < DIM  # the case has coordinates of both kinds
    assert steps[0][1]["dp2_capped_fraction"] == pytest.approx(float(capped.float().mean()))
    assert "dp2_capped_fraction" not in steps[1][1]
    noised_mean = steps[1][0] / (lr / p)
    expected = noised_mean * (lr / p).clamp(max=kappa / std)
    torch.testing.assert_close(steps[0][0], expected, rtol=1e-4, atol=1e-6)
    assert float((steps[0][0] / noised_mean).abs().max()) <= kappa / std * (1 + 1e-5)


def test_adadp_two_cohorts_second_at_the_half_step():
    alg = make("dp-fedavg-adadp", server_learning_rate=0.5)
    requests = []

    def train(request):
        requests.append(request)
        return fixed_updates()(request)

    w0 = alg.params.clone()
    lr0 = alg.opt_state.learning_rate
    res = drive_round(alg, 1, train)
    assert [r.stream for r in requests] == ["train", "train-2"]
    assert torch.equal(requests[0].params, w0)
    assert not torch.equal(requests[1].params, w0)
    assert requests[0].users != requests[1].users  # independent cohorts
    assert res.metrics["server_learning_rate"] == lr0
    assert alg.opt_state.learning_rate != lr0
    assert alg.accountant.num_events == 2


def test_distributed_mode_sends_the_share_std_to_clients():
    alg = make(noise_mode="distributed", min_shares=4, clip_norm=2.0, noise_multiplier=1.2)
    req = next(alg.run_round(1))
    assert req.settings.local.noise_std == pytest.approx(1.2 * 2.0 / 2.0)
    assert req.settings.report_private_metrics is False
    default = make(noise_mode="distributed")
    assert 1 <= default.aggregator.min_shares < 8


@pytest.mark.parametrize("strategy", ["dp-fedadam", "dp-fedadam-bc", "dp-fedavg-adadp"])
def test_the_optimizer_sees_the_accounted_noise_not_the_accepted_count(strategy):
    # seventeenth review of issue 15: with distributed noise the aggregate's noise std grows with
    # the shares accepted above min-shares; DP-FedAdam's tau, DP-AdamBC's Phi and ADADP's
    # tolerance take the accounted sigma C / m instead (the noised mean is their only data input)
    alg = make(strategy, noise_mode="distributed", min_shares=2, clip_norm=2.0)
    accounted = 1.0 * 2.0 / 8
    seen = []
    update = alg.transform.update if strategy != "dp-fedavg-adadp" else None

    def spy(*args, noise_variance=None, **kw):
        seen.append(noise_variance)
        return update(*args, noise_variance=noise_variance, **kw)

    if update is not None:
        alg.transform = alg.transform._replace(update=spy)
    res = drive_round(alg, 1, fixed_updates())
    shares = res.metrics["accepted" if update is not None else "accepted_1"]
    realized = res.metrics["noise_std" if update is not None else "noise_std_1"]
    assert shares > 2 and realized == pytest.approx(accounted * math.sqrt(shares / 2))
    if update is not None:
        assert seen == [pytest.approx(accounted**2)]
    else:
        tol = alg.round_tolerance(accounted, accounted, alg.params)
        assert res.metrics["adadp_tolerance"] == pytest.approx(tol)
    server = make(strategy, clip_norm=2.0)
    agg = server.aggregate(1, fixed_updates()(next(server.run_round(1))))
    assert server.optimizer_noise_std(agg) == agg.noise_std == pytest.approx(accounted)


def test_checkpoint_round_trip_continues_identically():
    a = make("dp-fedadam-bc")
    for r in (1, 2):
        drive_round(a, r, fixed_updates())
    b = make("dp-fedadam-bc")
    b.load_state_dict(a.state_dict())
    ra, rb = drive_round(a, 3, fixed_updates()), drive_round(b, 3, fixed_updates())
    assert torch.equal(ra.params, rb.params) and a.epsilon() == b.epsilon()
    with pytest.raises(ValueError, match="different configuration"):
        make("dp-fedadam").load_state_dict(a.state_dict())


@pytest.mark.parametrize(
    ("key", "value", "msg"),
    [
        ("strategy", "dp-sgd", "strategy must be one of"),
        ("clients_per_round", 50, "population"),
        ("noise_multiplier", 0.0, "noise-multiplier must be > 0"),
        ("delta", 1.5, "delta"),
        ("local_epochs", 0, "local-epochs"),
        ("sampling", "uniform", "sampling"),
    ],
)
def test_config_errors_name_the_key(key, value, msg):
    with pytest.raises(ValueError, match=msg):
        config(**{key: value})


def test_config_from_mapping_kebab_case_and_unknown_keys():
    c = StrategyConfig.from_mapping(
        {"strategy": "fedavg", "clients-per-round": 5, "population": 10}
    )
    assert c.clients_per_round == 5.0 and c.sample_rate == 0.5 and not c.private
    assert StrategyConfig.from_mapping(c.to_mapping()) == c
    with pytest.raises(ValueError, match="unknown key 'client-lr'"):
        StrategyConfig.from_mapping({"client-lr": 1.0})


def test_a_pld_ledger_too_large_for_memory_is_refused_at_construction():
    from fedprivopt.privacy import PLDGridTooLargeError

    init = torch.zeros(10)
    with pytest.raises(PLDGridTooLargeError, match=r"noise_multiplier=0\.01"):
        build_algorithm(
            config(accountant="pld", noise_multiplier=0.01, clients_per_round=40), init
        )  # q = 1: one round's distribution alone would need ~22 GiB
    ok = build_algorithm(config(accountant="pld"), init)  # sigma 1, q 0.2, 5 rounds
    assert ok.epsilon() == 0.0
