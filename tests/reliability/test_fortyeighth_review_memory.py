"""Issue 15, forty-eighth hostile review (memory: bounded inputs): tests.

1. ``fedprivopt deploy local --nodes 64`` (also ``deploy_local(nodes=64)``) on a machine of
   23 GiB. Before: taken (``--nodes`` was only in ``[1, 64]``), where a node (SuperNode,
   SuperExec, ClientApp with torch and the task) holds 423 MB of proportional set size for the
   toy task (1.71 GB for 2 nodes, 3.40 GB for 6): 64 nodes about 28 GB. Now
   ``deploy.local_checks.check_nodes`` bounds ``--nodes`` by the physical memory over
   ``NODE_MEMORY`` (512 MiB), as ``compare --jobs`` is bounded: rc 2, one line, nothing written.
2. ``simulate toy.toml --rounds 1 --set population=100000000 --set task-params.num-users=100000000
   --set clients-per-round=100000000 --set sampling=fixed`` (also Poisson). Before: the round's
   cohort was made by iterating the sampler's tensor (a tensor object a user: 680 bytes a
   sampled user, 648 MB for 10**6), about 68 GB for 10**8; under a 4 GB address-space limit a
   ``RuntimeError: std::bad_alloc`` traceback, rc 1. Now ``strategies.cohorts`` reads the draw
   with ``tolist()`` (108 bytes a user; about 230 through a whole toy round) and
   ``StrategyConfig`` bounds ``clients-per-round`` by ``MAX_COHORT`` = 10**7 (about 2.3 GB):
   rc 2, one line, nothing written.
3. Memory 2 under tree noise: ``noise-mechanism = "tree"`` with a cohort of 10**7 (within
   ``MAX_COHORT``), ``alg.sample(1)``. Before: ``privacy.tree.TreeCohorts.cohort`` iterated the
   period's shuffle too (698 bytes a user, 666 MB for 10**6): ``std::bad_alloc`` under a 4 GB
   address-space limit. Now it reads it with ``tolist()``: 947 MB for 10**7 (99 bytes a user).
4. ``--resume`` of a seeded tree run whose period has drawn 10**7 users (population 10**7,
   4 rounds of 2.5·10**6; ``audit_tree.check_participants`` called as a resume calls it).
   Before: both the seed's shuffle and the checkpoint's participants were iterated into Python
   ints (655 bytes a user, 2.47 GB for 4·10**6): ``std::bad_alloc`` under a 4 GB limit. Now
   they are compared as sorted tensors (0.7 s, no growth); an exchanged user is still refused.
5. Every round of a tree run writes ``participants_sha256`` of its period's participants
   (``ledger_lines.tree_participants``). Before: the whole period as Python ints, sorted again
   and joined as one text: 81 bytes a participant (772 MB for 10**7 each round; a period of
   10**8, population 10**8 and cohorts of 10**7, about 8 GB). Now the same digest is hashed
   2**16 participants at a time.
6. ``deploy local --nodes 2 --set population=100000000 --set task-params.num-users=100000000``.
   Before: taken; the ServerApp's user query maps every user to its node (2.25 GB for 10**7
   toy users, measured; about 20 GB for 10**8). Now ``check_nodes`` bounds a deployment's
   population by the memory over ``USER_MEMORY`` (512 bytes a user): rc 2, one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedprivopt.deploy import local_checks
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import build_run
from fedprivopt.strategies.config import MAX_COHORT, StrategyConfig

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def test_1_deploy_nodes_bounded_by_memory(monkeypatch, tmp_path):
    monkeypatch.setattr(local_checks, "physical_memory", lambda: 4 * 2**30)
    assert local_checks.check_nodes(8) == 8  # 4 GiB over 512 MiB
    with pytest.raises(ValueError, match=r"--nodes must be an integer in \[1, 8\] on this machine"):
        local_checks.check_nodes(9)
    from fedprivopt.deploy.local import deploy_local

    out = tmp_path / "D"
    with pytest.raises(ValueError, match=r"--nodes .*\[1, 8\]"):
        deploy_local(nodes=9, tls=False, out=str(out))
    assert not out.exists()
    monkeypatch.setattr(local_checks, "physical_memory", lambda: 0)  # unknown: the fixed bound
    assert local_checks.check_nodes(64) == 64


def test_2_cohort_bounded_and_not_one_tensor_a_user(monkeypatch):
    assert MAX_COHORT == 10**7
    StrategyConfig(population=10**8, clients_per_round=float(MAX_COHORT))
    with pytest.raises(ValueError, match=r"clients-per-round must be .*\(0, 1e\+07\]"):
        StrategyConfig(population=10**8, clients_per_round=10**8, sampling="fixed")
    for sampling in ("fixed", "poisson"):
        sets = {"population": 2000, "task-params.num-users": 2000, "clients-per-round": 1000}
        _, alg = build_run(load_config(TOY, {**sets, "sampling": sampling}))

        def one_tensor_a_user(self):
            raise AssertionError("the cohort iterated the sampler's tensor")

        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "__iter__", one_tensor_a_user)
            users = alg.sample(1)
        assert len(users) > 500 and all(type(u) is int for u in users)


def test_3_tree_cohort_not_one_tensor_a_user(monkeypatch):
    sets = {"population": 2000, "task-params.num-users": 2000, "clients-per-round": 1000}
    sets.update({"noise-mechanism": "tree", "num-server-rounds": 2})
    _, alg = build_run(load_config(TOY, sets))

    def one_tensor_a_user(self):
        raise AssertionError("the tree cohort iterated the period's shuffle")

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "__iter__", one_tensor_a_user)
        users = alg.sample(1)
    assert len(users) == 1000 and users == sorted(set(users))
    assert all(type(u) is int for u in users)


def test_4_resume_audit_of_tree_participants_compares_tensors(monkeypatch):
    from fedprivopt.simulation.audit_tree import check_participants

    sets = {"population": 400, "task-params.num-users": 400, "clients-per-round": 100}
    sets.update({"noise-mechanism": "tree", "num-server-rounds": 4})
    _, alg = build_run(load_config(TOY, sets))
    cohorts = alg.tree_cohorts
    drawn = cohorts.order(0)[:400].tolist()
    cohorts.ledger.check_in(0, drawn)
    alg.round_num = 4

    def one_tensor_a_user(self):
        raise AssertionError("the audit iterated a tensor of users")

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "__iter__", one_tensor_a_user)
        check_participants(alg, [], "checkpoint.pt")  # what the seed drew: taken
    _, alg = build_run(load_config(TOY, {**sets, "population": 401, "task-params.num-users": 401}))
    cohorts = alg.tree_cohorts
    order = cohorts.order(0).tolist()
    cohorts.ledger.check_in(0, order[:399] + order[400:401])  # one user exchanged
    alg.round_num = 4
    with pytest.raises(ValueError, match="holds other users than the 400"):
        check_participants(alg, [], "checkpoint.pt")


def test_5_tree_participants_digest_hashed_in_chunks():
    import tracemalloc
    from types import SimpleNamespace

    from fedprivopt.privacy.tree import ParticipationLedger
    from fedprivopt.simulation.ledger_lines import participants_sha256, tree_participants

    def digest_of(ids):
        ledger = ParticipationLedger(400_000)
        ledger.check_in(3, ids)
        return tree_participants(SimpleNamespace(tree_cohorts=SimpleNamespace(ledger=ledger)))

    for n in (0, 1, 2**16, 2**16 + 1):  # the same digest as the one text
        ids = torch.randperm(400_000)[:n].tolist()
        assert digest_of(ids) == participants_sha256(3, ids)
    ids = torch.randperm(400_000)[:300_000].tolist()
    tracemalloc.start()
    try:
        digest_of(ids)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * 2**20, peak  # the whole period's text and ints: 34 MB here


def test_6_deploy_population_bounded_by_memory(monkeypatch, tmp_path):
    monkeypatch.setattr(local_checks, "physical_memory", lambda: 2**30)
    assert local_checks.check_nodes(1, population=2**21) == 1  # 1 GiB over 512 bytes
    with pytest.raises(ValueError, match=r"population must be at most 2,097,152 for a local"):
        local_checks.check_nodes(1, population=2**21 + 1)
