"""Issue 15, twenty-ninth hostile review (privacy area): regression tests of its findings.

1. The ``rdp`` accountant at a large σ or a tiny q: ``fedprivopt epsilon --noise-multiplier 1e10
   --sample-rate 0.1 --rounds 1`` printed ``epsilon = inf`` (also σ 1e8 at q = 1, σ 1000 at
   q = 1e-5, σ 100 at q = 1e-8), and ``--noise-multiplier 1e5 --sample-rate 0.001 --rounds 1``
   printed 14.80 where σ = 1e4 printed 0.0000. The thirteenth review dropped (as ``inf``) every
   order whose RDP dp-accounting computes within rounding of 0, so at such σ every order was
   dropped, or only fractional orders near 1 were left, whose series dp-accounting sums with an
   absolute error near 1e-10 (1.7e-10 at order 1.7 for a true 8.5e-17). Both were upper bounds,
   but useless ones: a run with a target ε at such a σ stopped before its first round. Now
   those orders take the RDP dp-accounting gives the event's mechanism without sampling (a
   closed form; sampling never raises a Rényi divergence): ε is finite, still an upper bound
   (checked against the exact ε of the Gaussian mechanism), and never larger for more noise in
   these cases. Every finite value dp-accounting gives is kept (880 Poisson and 126 fixed-size,
   adaptive and tree ledgers of ordinary σ compose to the same ε as before, so no earlier run's
   ledger reads as edited). The tuning bound, which dp-accounting composes from the run's event,
   keeps its orders.
2. The Flower strategy's user discovery (``DPStrategy.discover_users``, also the first thing
   ``start`` does) trusted each node's answer to the user query: a reply without the ``users``
   record raised ``KeyError`` out of the ServerApp, user ids ``[nan]`` or ``["a"]`` a
   ``ValueError`` from ``int()``, a scalar a ``TypeError``, and a reply naming one user twice
   ``RuntimeError: user 0 is hosted by two nodes``; ``[0.5, 1.7]``, ``[True, False]``, ``["3"]``,
   ``[-1, 10**18]`` and ``b"abc"`` were taken as the user ids 0, 1 (and 3, -1, 10**18, and 97,
   98, 99). ``wire.read_user_ids`` now requires a list of distinct integers ``>= 0``, and the
   strategy treats a malformed answer as an error reply: one warning naming the node, its users
   on no node (unhosted, never sampled differently: the accounting follows the sampling).
   ``clients.reply_users`` (a user's own ClientApp) sent ``[0.5, 1.7]``, ``[True]``, ``["3"]``
   as users 0, 1, 1 and 3; it now refuses what the server refuses (``ValueError``).
3. A train reply holding an update under the key ``update/`` followed by 4,301 digits or more
   (a hostile or broken ClientApp) raised ``ValueError: Exceeds the limit (4300 digits) for
   integer string conversion`` out of ``DPStrategy.aggregate_train``, ending the ServerApp (its
   docstring: nothing a client sends can raise there), and each unrequested key was logged
   whole (a 100,000-character key in a 100,000-character line). Such a key is now no update key
   (``wire.parse_update_key``: at most 19 digits): counted in ``unrequested``, logged cut.
4. A round run twice through the Python API (``drive_round(alg, 1, train)`` twice,
   ``alg.run_round(1)`` again, or ``DPStrategy.configure_train`` with a server round already
   released) was released again with the same seeded server noise (and the same cohort): with
   one user's update missing the second time (a dropout), the difference of the two released
   models times ``m̄`` was exactly that user's clipped update, while the accountant charged two
   independent releases (ε 5.60). ``ServerAlgorithm.aggregate``, where every round's noised
   mean is made, now refuses a round at or before the last released one, before any noise is
   drawn.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, Metadata, MetricRecord, RecordDict
from scipy.optimize import brentq
from scipy.stats import norm

from fedprivopt import wire as P
from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
from tests.reliability.test_twentyninth_review_cli import _cli  # main in this process

ROOT = Path(__file__).resolve().parents[2]


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε at ``delta`` of a Gaussian mechanism of sensitivity over noise ``mu``."""

    def excess(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    return 0.0 if excess(0.0) <= 0 else brentq(excess, 0.0, 10.0, xtol=1e-15)


# -- finding 1: the rdp accountant at a large sigma or a tiny sample rate --------------------------


def test_1_rdp_epsilon_at_a_huge_sigma_is_a_finite_upper_bound():
    # q = 1: 10**12 rounds at σ = 1e8 are exactly one Gaussian of σ/√(10**12) = 100 (μ = 0.01)
    event = SubsampledGaussianEvent.poisson(sample_rate=1.0, noise_multiplier=1e8)
    eps = compose_epsilon([(event, 10**12)], 1e-5)  # was inf
    exact = _gaussian_epsilon(0.01, 1e-5)  # 0.0272
    assert exact <= eps <= 1.5 * exact
    # the same with fixed-size sampling (replace-one) and with the adaptive-clipping pair
    fixed = SubsampledGaussianEvent.fixed(population=10**6, cohort_size=10, noise_multiplier=1e8)
    assert math.isfinite(compose_epsilon([(fixed, 10**12)], 1e-5))
    pair = SubsampledGaussianEvent.poisson(
        sample_rate=0.5, noise_multiplier=1e9, count_noise_multiplier=1e10
    )
    assert math.isfinite(compose_epsilon([(pair, 10**12)], 1e-5))


@pytest.mark.parametrize(("q", "sigma"), [(1.0, 1e8), (0.1, 1e10), (1e-5, 1e3), (1e-8, 100.0)])
def test_1_rdp_epsilon_is_finite_where_every_order_cancelled(q, sigma):
    event = SubsampledGaussianEvent.poisson(sample_rate=q, noise_multiplier=sigma)
    for rounds in (1, 10**6):
        eps = compose_epsilon([(event, rounds)], 1e-5)
        assert math.isfinite(eps), (q, sigma, rounds)  # was inf
        # never above the unsampled Gaussian's (q = 1: dp-accounting's closed form)
        alone = SubsampledGaussianEvent.poisson(sample_rate=1.0, noise_multiplier=sigma)
        assert eps <= compose_epsilon([(alone, rounds)], 1e-5)


def test_1_more_noise_never_reports_more_epsilon():
    def eps(sigma: float) -> float:
        event = SubsampledGaussianEvent.poisson(sample_rate=0.001, noise_multiplier=sigma)
        return compose_epsilon([(event, 1)], 1e-5)

    assert eps(1e5) <= eps(1e4) < 0.01  # was 14.80 and 0.0
    assert eps(1e6) <= eps(1e5)


def test_1_epsilon_command_prints_a_finite_epsilon(tmp_path):
    argv = ["epsilon", "--sample-rate", "0.1", "--rounds", "1", "--delta", "1e-5"]
    proc = _cli(tmp_path, *argv, "--noise-multiplier", "1e10")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("epsilon = 0.0000 "), proc.stdout  # was "epsilon = inf"
    proc = _cli(tmp_path, "epsilon", "--noise-multiplier", "1e5", "--sample-rate", "0.001",
                "--rounds", "1", "--delta", "1e-5")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("epsilon = 0.0000 "), proc.stdout  # was 14.8017


# -- finding 2: a malformed answer to the user query --------------------------------------------

NODES = {100: [0, 1], 101: [2, 3]}


class QueryGrid:
    """Answers the user query: node 100 with ``hostile``, node 101 as fedprivopt's ClientApp."""

    def __init__(self, hostile: RecordDict):
        self.hostile = hostile

    def get_node_ids(self):
        return list(NODES)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for i, msg in enumerate(messages):
            node = msg.metadata.dst_node_id
            honest = RecordDict({P.USERS_RECORD: MetricRecord({P.USER_IDS: NODES[node]})})
            metadata = Metadata(
                run_id=1, message_id=f"r{i}", src_node_id=node, dst_node_id=0,
                reply_to_message_id=msg.metadata.message_id, group_id="", created_at=0.0,
                ttl=60.0, message_type="query",
            )  # fmt: skip
            replies.append(Message(self.hostile if node == 100 else honest, metadata=metadata))
        return replies


def user_query_strategy() -> DPStrategy:
    """A DP-FedAvg Flower strategy over 4 users, 2 a round, for the user-query tests."""
    config = StrategyConfig(
        strategy="dp-fedavg", population=4, clients_per_round=2, num_server_rounds=1,
        noise_multiplier=0.8, clip_norm=1.0, seed=5,
    )  # fmt: skip
    flat, spec = flatten({"w": torch.zeros(3)})
    return DPStrategy(build_algorithm(config, flat), spec, node_wait=0.0)


def _ids(value) -> RecordDict:
    return RecordDict({P.USERS_RECORD: ConfigRecord({P.USER_IDS: value})})


@pytest.mark.parametrize(
    "hostile",
    [
        RecordDict(),
        RecordDict({P.USERS_RECORD: ConfigRecord({"x": 1})}),
        RecordDict({P.USERS_RECORD: ArrayRecord({"a": Array(np.zeros(2))})}),
        _ids([float("nan")]), _ids(["a"]), _ids(5), _ids([0, 0]), _ids([0.5, 1.7]),
        _ids([True, False]), _ids(["3"]), _ids([-1, 10**18]), _ids(b"abc"),
    ],
    ids=["no-record", "no-key", "array-record", "nan", "text", "scalar", "repeat", "floats",
         "bools", "digits", "negative", "bytes"],
)  # fmt: skip
def test_2_a_malformed_user_query_answer_is_a_node_error(server_side, hostile, caplog):
    strategy = user_query_strategy()
    mapping = strategy.discover_users(QueryGrid(hostile))  # raised, or took bogus user ids
    assert mapping == {2: 101, 3: 101}
    assert strategy.node_errors == 1


def test_2_read_user_ids_keeps_an_honest_answer():
    assert P.read_user_ids(RecordDict({P.USERS_RECORD: MetricRecord({P.USER_IDS: [4, 1]})})) == [
        4,
        1,
    ]
    assert P.read_user_ids(_ids([])) == []
    with pytest.raises(ValueError, match="user-ids must be a list of integers >= 0"):
        P.read_user_ids(_ids([1.0]))


# -- finding 3: an update key of thousands of digits ---------------------------------------------


def test_3_a_huge_update_key_is_unrequested_not_a_crash(server_side, caplog):
    from tests.reliability.test_fuzz_replies import honest, make_strategy, reply

    strategy = make_strategy()
    list(strategy.configure_train(1, None, None, None))
    content = RecordDict()
    for user in (0, 1):  # node 100's users
        content[P.update_key(user)] = ArrayRecord({P.DELTA_ARRAY: Array(honest(user))})
    content["update/" + "9" * 100_000] = ArrayRecord({P.DELTA_ARRAY: Array(honest(0))})
    with caplog.at_level("WARNING", logger="flwr"):
        _, metrics = strategy.aggregate_train(1, [reply(100, content)])  # raised ValueError
    assert metrics["unrequested"] == 1 and metrics["accepted"] == 2
    assert max(len(r.getMessage()) for r in caplog.records) < 300
    assert P.parse_update_key("update/" + "9" * 19) == 10**19 - 1
    assert P.parse_update_key("update/" + "9" * 20) is None


# -- finding 4: a round run twice repeats its seeded noise ---------------------------------------


def test_4_a_released_round_cannot_run_again():
    from fedprivopt.strategies.core import drive_round

    config = StrategyConfig(
        strategy="dp-fedavg", population=20, clients_per_round=5, num_server_rounds=3,
        noise_multiplier=0.8, clip_norm=1.0, seed=5,
    )  # fmt: skip
    alg = build_algorithm(config, torch.zeros(4))

    def train(request):
        return {u: torch.full((4,), 0.1) for u in request.users}

    first = drive_round(alg, 1, train)
    released = first.params.clone()
    events = alg.accountant.num_events
    for again in (1, 0):
        with pytest.raises(ValueError, match=r"round 1 was released already|round_num"):
            drive_round(alg, again, lambda r: {u: torch.full((4,), 0.1) for u in r.users[1:]})
    assert torch.equal(alg.params, released) and alg.accountant.num_events == events
    drive_round(alg, 2, train)  # the next round still runs (and a skipped round number too)
    drive_round(alg, 4, train)
    assert alg.round_num == 4 and alg.accountant.num_events == 3


def test_2_reply_users_refuses_what_the_server_would_refuse(server_side):
    from fedprivopt.clients.messages import reply_users

    query = Message(P.users_query(), dst_node_id=5, message_type="query")
    for users in ([0.5, 1.7], [True], ["3"], [-1], [2, 2]):
        with pytest.raises(ValueError, match="users"):
            reply_users(query, users)  # were sent as users 0, 1 / 1 / 3 / -1 / 2, 2
    reply = reply_users(query, [np.int64(4), 1])
    assert P.read_user_ids(reply.content) == [4, 1]
