"""A privacy budget stops the run before it is exceeded, for every accountant, and a resumed
budget-stopped run does not train further."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivopt.privacy import compose_epsilon, make_round_event
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.core import drive_round
from tests.simulation.test_run import PRESET

USERS, MAX_ROUNDS, DELTA = 20, 40, 1e-4


def budget_config(sigma, cohort, target, accountant):
    return load_config(
        PRESET,
        {
            "population": USERS,
            "task-params.num-users": USERS,
            "clients-per-round": cohort,
            "noise-multiplier": sigma,
            "target-epsilon": target,
            "accountant": accountant,
            "delta": DELTA,
            "num-server-rounds": MAX_ROUNDS,
            "eval-every": 10,
            "checkpoint-every": 4,
        },
    )


def affordable_rounds(sigma, q, target, accountant, limit=MAX_ROUNDS):
    """Largest R <= limit with ε(R) <= target, from the library directly (events 1..R)."""
    event = make_round_event(sigma, sample_rate=q)
    rounds = 0
    while rounds < limit:
        if compose_epsilon([(event, rounds + 1)], DELTA, accountant=accountant) > target:
            break
        rounds += 1
    return rounds


# (sigma, clients per round of 20 users, target epsilon, accountant): rounds the budget allows
# range from 0 (the first round alone would exceed it: nothing is released, and a resume of such
# a run restarts and stops again) to 22
GRID = [
    (0.8, 2, 5.0, "rdp"),
    (0.8, 6, 2.0, "rdp"),
    (0.8, 6, 5.0, "rdp"),
    (1.5, 2, 1.0, "rdp"),
    (1.5, 6, 2.0, "rdp"),
    (1.5, 6, 5.0, "rdp"),
    (3.0, 6, 1.0, "rdp"),
    (3.0, 6, 2.0, "rdp"),
    # a PLD evaluation costs 1-2 s here (it builds the subsampled Gaussian's PLD each time), so
    # one PLD case; (0.8, 2, 2.0) and (0.8, 6, 5.0) with PLD also pass (35 s together)
    (1.5, 6, 2.0, "pld"),
]


@pytest.mark.parametrize(("sigma", "cohort", "target", "accountant"), GRID)
def test_run_stops_before_the_budget_and_resume_runs_no_more(
    tmp_path, sigma, cohort, target, accountant
):
    config = budget_config(sigma, cohort, target, accountant)
    outcome = simulate(config, tmp_path / "run")
    expected = affordable_rounds(sigma, cohort / USERS, target, accountant)
    assert outcome.stopped_reason == "budget" and outcome.rounds_completed == expected
    assert outcome.epsilon <= target
    summary = json.loads((outcome.out_dir / "summary.json").read_text())
    assert summary["epsilon"] == outcome.epsilon and summary["stopped_reason"] == "budget"

    again = resume(outcome.out_dir)
    assert again.rounds_completed == outcome.rounds_completed
    assert again.stopped_reason == "budget" and again.epsilon == outcome.epsilon
    assert torch.equal(again.params, outcome.params)


@settings(max_examples=20, deadline=None)
@given(
    sigma=st.sampled_from((0.6, 1.0, 2.0, 4.0)),
    cohort=st.integers(1, 12),
    target=st.floats(0.3, 8.0),
    sampling=st.sampled_from(("poisson", "fixed")),
    strategy=st.sampled_from(("dp-fedavg", "dp-fedavg-adadp")),
)
def test_budget_is_never_exceeded_and_the_stop_is_tight(sigma, cohort, target, sampling, strategy):
    config = StrategyConfig(
        strategy=strategy,
        population=USERS,
        clients_per_round=cohort,
        sampling=sampling,
        noise_multiplier=sigma,
        clip_norm=1.0,
        target_epsilon=target,
        delta=DELTA,
        num_server_rounds=30,
        seed=1,
    )
    alg = build_algorithm(config, torch.zeros(4))

    def train(request):
        return {u: torch.full((4,), 0.1) for u in request.users}

    for r in range(1, config.num_server_rounds + 1):
        if not alg.budget_allows_next_round():
            # stopping was necessary: one more round would have exceeded the target
            assert alg.accountant.epsilon_after(alg.round_events(), DELTA) > target
            break
        drive_round(alg, r, train)
        assert alg.epsilon() <= target
    events = alg.accountant.num_events
    assert events == alg.round_num * (2 if strategy == "dp-fedavg-adadp" else 1)
    assert alg.epsilon() <= target
