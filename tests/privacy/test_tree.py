"""Tree aggregation: the noise the tree implies, its accounting and the participation ledger."""

import math

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import rdp

from fedprivopt.privacy.accounting import PrivacyAccountant, compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.tree import (
    ParticipationError,
    ParticipationLedger,
    TreeCohorts,
    TreeNoise,
    calibrate_tree,
    prefix_nodes,
    released_nodes,
    tree_depth,
    tree_position,
)
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round

SIGMA, CLIP, DIM = 0.7, 1.5, 200_000


def test_prefix_nodes_are_the_binary_decomposition():
    assert prefix_nodes(0) == []
    assert prefix_nodes(1) == [(0, 0)]
    assert prefix_nodes(6) == [(2, 0), (1, 2)]  # leaves 1-4 and 5-6
    assert prefix_nodes(7) == [(2, 0), (1, 2), (0, 6)]
    for t in range(1, 70):
        nodes = prefix_nodes(t)
        assert len(nodes) == bin(t).count("1")
        # the nodes tile the leaves 1..t exactly
        covered = [leaf for lvl, j in nodes for leaf in range(j * 2**lvl + 1, (j + 1) * 2**lvl + 1)]
        assert covered == list(range(1, t + 1))
        assert released_nodes(t) == 1 + len(bin(t)) - len(bin(t).rstrip("0"))
    assert tree_position(1, 4) == (0, 1) and tree_position(4, 4) == (0, 4)
    assert tree_position(5, 4) == (1, 1)


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 8, 100])
def test_depth_is_the_ancestors_of_a_leaf(steps):
    """A leaf's ancestors among the nodes a ``steps``-leaf tree completes."""
    completed = {(lvl, j) for t in range(1, steps + 1) for lvl, j in prefix_nodes(t)}
    most = max(sum((lvl, (leaf - 1) >> lvl) in completed for lvl in range(12))
               for leaf in range(1, steps + 1))  # fmt: skip
    assert tree_depth(steps) == most == math.ceil(math.log2(steps + 1))


def test_released_prefix_sums_carry_the_variance_the_tree_implies():
    """Prefix t of the released noise has popcount(t) nodes of variance σ²C² each.

    The coordinates are independent draws (200,000 of them per round): the measured variance
    has a relative standard error of sqrt(2/200000) = 0.3%, so 2% is a 6-sigma band.
    """
    tree = TreeNoise(std=SIGMA * CLIP, restart_rounds=8, rngs=RngFactory(3), dim=DIM,
                     dtype=torch.float64)  # fmt: skip
    prefix = torch.zeros(DIM, dtype=torch.float64)
    node_var = (SIGMA * CLIP) ** 2
    for r in range(1, 13):  # a period of 8, then the first 4 of the next
        noise, nodes = tree.release(r)
        step = tree_position(r, 8)[1]
        prefix = noise if step == 1 else prefix + noise
        assert nodes == released_nodes(step)
        assert noise.var().item() == pytest.approx(nodes * node_var, rel=0.02)
        assert prefix.var().item() == pytest.approx(bin(step).count("1") * node_var, rel=0.02)
        assert abs(prefix.mean().item()) < 5 * math.sqrt(node_var * 4 / DIM)


def test_the_released_rounds_are_the_differences_of_the_prefix_estimates():
    """Release t = (sum of prefix_nodes(t)) - (sum of prefix_nodes(t-1)), node by node."""
    rngs = RngFactory(5)
    tree = TreeNoise(std=1.0, restart_rounds=16, rngs=rngs, dim=5, dtype=torch.float64)
    nodes = {}

    def node(lvl, j):
        if (lvl, j) not in nodes:
            g = rngs.generator(0, "tree-noise", lvl, j)
            nodes[(lvl, j)] = torch.randn(5, generator=g, dtype=torch.float64)
        return nodes[(lvl, j)]

    def estimate(t):
        return sum((node(*n) for n in prefix_nodes(t)), torch.zeros(5, dtype=torch.float64))

    for t in range(1, 17):
        noise, _ = tree.release(t)
        torch.testing.assert_close(noise, estimate(t) - estimate(t - 1), rtol=0, atol=1e-12)


def test_end_to_end_noise_of_the_released_means():
    """Through the server algorithm: zero updates, so m·Δ̃ is the released noise itself."""
    m, T = 4, 6
    config = StrategyConfig(strategy="dp-fedavg", population=40, clients_per_round=m,
                            num_server_rounds=T, noise_multiplier=SIGMA, clip_norm=CLIP,
                            noise_mechanism="tree", tree_restart_rounds=T, seed=2)  # fmt: skip
    alg = build_algorithm(config, torch.zeros(DIM))
    prefix = torch.zeros(DIM, dtype=torch.float64)
    for t in range(1, T + 1):
        users = alg.sample(t)  # aggregate needs the cohort under tree (fortieth review, api 6)
        agg = alg.aggregate(t, {u: torch.zeros(DIM) for u in users}, cohort=users)
        prefix += agg.delta_tilde.double() * m
        want = bin(t).count("1") * (SIGMA * CLIP) ** 2
        assert prefix.var().item() == pytest.approx(want, rel=0.03)
        assert agg.noise_std == pytest.approx(math.sqrt(released_nodes(t)) * SIGMA * CLIP / m)


def _dp_accounting_epsilon(sigma, steps, periods, delta):
    acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
    tree = dpa.SingleEpochTreeAggregationDpEvent(sigma, steps)
    acc.compose(dpa.SelfComposedDpEvent(tree, periods))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("rounds", [1, 5, 6, 7, 13])
def test_epsilon_of_a_tree_run_is_dp_accountings(rounds):
    """A period is charged whole at its first round: ⌈rounds/T⌉ trees of T steps."""
    T, sigma, delta = 6, 1.3, 1e-5
    config = StrategyConfig(strategy="dp-fedadam", population=60, clients_per_round=10,
                            num_server_rounds=rounds, noise_multiplier=sigma, delta=delta,
                            noise_mechanism="tree", tree_restart_rounds=T)  # fmt: skip
    alg = build_algorithm(config, torch.zeros(8))
    for r in range(1, rounds + 1):
        drive_round(alg, r, lambda req: {u: 0.1 * torch.ones(8) for u in req.users})
    periods = -(-rounds // T)
    want = _dp_accounting_epsilon(sigma, T, periods, delta)
    assert alg.epsilon() == pytest.approx(want, rel=1e-12)
    assert alg.accountant.num_events == periods == alg.events_through(rounds)


def test_tree_event_round_trips_and_only_rdp_accounts_it():
    event = SubsampledGaussianEvent.tree(population=50, cohort_size=5, noise_multiplier=2.0,
                                         restart_rounds=10)  # fmt: skip
    assert SubsampledGaussianEvent.from_dict(event.to_dict()) == event
    assert event.neighboring_relation is dpa.NeighboringRelation.REPLACE_SPECIAL
    acc = PrivacyAccountant()
    acc.step(event, count=3)
    restored = PrivacyAccountant()
    restored.load_state_dict(acc.state_dict())
    assert (
        restored.epsilon(1e-6)
        == acc.epsilon(1e-6)
        == pytest.approx(_dp_accounting_epsilon(2.0, 10, 3, 1e-6), rel=1e-12)
    )
    for name in ("pld", "prv"):
        with pytest.raises(ValueError, match="use accountant 'rdp'"):
            compose_epsilon([(event, 1)], 1e-6, accountant=name)
    poisson = SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="tree events with either"):
        compose_epsilon([(event, 1), (poisson, 1)], 1e-6)


def test_the_participation_ledger_refuses_a_second_check_in_in_a_period():
    ledger = ParticipationLedger(10)
    ledger.check_in(0, [1, 2, 3])
    with pytest.raises(ParticipationError, match="user 2 already took part in restart period 0"):
        ledger.check_in(0, [5, 2])
    ledger.check_in(0, [5])  # the refused check-in recorded nothing
    with pytest.raises(ParticipationError):
        ledger.check_in(0, [7, 7])
    ledger.check_in(1, [1, 2, 3])  # a new period
    with pytest.raises(ParticipationError, match="period 0 is over"):
        ledger.check_in(0, [9])
    copy = ParticipationLedger(10)
    copy.load_state_dict(ledger.state_dict())
    with pytest.raises(ParticipationError):
        copy.check_in(1, [3])


def test_cohorts_of_a_period_are_disjoint_and_skip_unavailable_users():
    cohorts = TreeCohorts(population=20, cohort_size=4, restart_rounds=5, rngs=RngFactory(1))
    period = [cohorts.cohort(r) for r in range(1, 6)]
    assert sorted(u for c in period for u in c) == list(range(20))
    assert set(cohorts.cohort(6)) != set(period[0])  # a new shuffle in period 1
    # deployment: only some users reachable; someone already in the period is never picked
    cohorts = TreeCohorts(population=20, cohort_size=4, restart_rounds=5, rngs=RngFactory(1))
    first = cohorts.cohort(1)
    reachable = torch.zeros(20, dtype=torch.bool)
    reachable[[*first, 19]] = True
    assert cohorts.cohort(2, reachable) == ([19] if 19 not in first else [])
    with pytest.raises(ValueError, match="cohort_size"):
        TreeCohorts(population=20, cohort_size=5, restart_rounds=5, rngs=RngFactory(1))


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"tree-restart-rounds": 9}, "tree-restart-rounds"),
        ({"clients-per-round": 4.5}, "clients-per-round"),
        ({"noise-mode": "distributed"}, "noise-mode"),
        ({"adaptive-clipping": True}, "adaptive-clipping"),
        ({"accountant": "pld"}, "accountant"),
        ({"strategy": "dp-fedavg-adadp"}, "strategy 'dp-fedavg-adadp'"),
        ({"strategy": "dp2", "clip-norm-adaptive": 2.0}, "clip-norm-adaptive"),
        ({"noise-mechanism": "matrix"}, "noise-mechanism"),
    ],
)
def test_config_refuses_what_the_tree_cannot_do_naming_the_key(extra, key):
    base = {"population": 40, "clients-per-round": 5, "noise-mechanism": "tree"}
    with pytest.raises(ValueError, match=key):
        StrategyConfig.from_mapping({**base, **extra})


def test_default_restart_is_one_pass_and_defaults_stay_out_of_the_mapping():
    config = StrategyConfig.from_mapping({"population": 43, "clients-per-round": 5,
                                          "noise-mechanism": "tree"})  # fmt: skip
    assert config.restart_rounds == 8 and config.tree
    plain = StrategyConfig.from_mapping({"population": 43, "clients-per-round": 5})
    assert "noise-mechanism" not in plain.to_mapping()
    assert "tree-restart-rounds" not in plain.to_mapping()
    assert StrategyConfig.from_mapping(config.to_mapping()) == config


@pytest.mark.parametrize(("target", "restart", "rounds"), [(2.0, 40, 40), (5.0, 10, 35)])
def test_calibrated_sigma_meets_the_target_tightly(target, restart, rounds):
    sigma = calibrate_tree(target, 1e-5, restart_rounds=restart, rounds=rounds)
    periods = -(-rounds // restart)
    eps = _dp_accounting_epsilon(sigma, restart, periods, 1e-5)
    assert eps <= target and eps == pytest.approx(target, rel=1e-4)


def test_a_secure_tree_resumed_from_its_state_continues_the_same_prefix():
    """Secure mode: nodes cannot be regenerated, so the checkpointed ones must be used.

    After round 3 the state is restored into a fresh tree; its round-4 release must cancel
    exactly the live nodes of round 3, so that the prefix of the four releases is the one node
    covering leaves 1-4 (the noise of a prefix stays popcount(t) nodes across the resume).
    """
    tree = TreeNoise(std=1.0, restart_rounds=8, rngs=RngFactory(None, secure=True), dim=50,
                     dtype=torch.float64)  # fmt: skip
    prefix = sum(tree.release(r)[0] for r in (1, 2, 3))
    resumed = TreeNoise(std=1.0, restart_rounds=8, rngs=RngFactory(None, secure=True), dim=50,
                        dtype=torch.float64)  # fmt: skip
    resumed.load_state_dict(tree.state_dict())
    noise, nodes = resumed.release(4)
    assert nodes == 3
    (live,) = resumed.state_dict()["nodes"]
    assert live[:2] == [2, 0]
    torch.testing.assert_close(prefix + noise, live[2], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="round by round"):
        resumed.release(6)
    bad = tree.state_dict() | {"round": 4}
    with pytest.raises(ValueError, match="prefix nodes"):
        resumed.load_state_dict(bad)
