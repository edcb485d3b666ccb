"""Issue 15, thirty-eighth hostile review (accounting: the ε itself and bounded memory): tests.

1. ``fedprivopt epsilon --accountant prv`` (or a run with ``accountant = "prv"``) at the PRV
   guard's limit, e.g. ``--noise-multiplier 0.5 --sample-rate 1 --rounds 257 --delta 1e-5``
   (7.4e6 domain points, "about 510 MiB, limit 512 MiB"): the peak resident memory was 1.58 GB,
   1.25 GB above the 0.35 GB of the command without it (the same at σ 5, q 0.01, 667,995
   rounds and at σ 20, q 1, 22,509 rounds). ``prv_guard._PRV_BYTES`` took 72 bytes a domain
   point from tracemalloc, which sees 67 of the 176-184 bytes a point the process's resident
   memory grows by from about 1.5e6 points. Now 200 bytes a point: the largest accepted domain
   is 2.7e6 points (peak about 0.5 GB above the baseline, as the limit says).
2. ``check_pld_ledger([(event, n)])`` (what a run with ``accountant = "pld"`` checks at its
   start for its planned rounds) accepted a ledger whose composition has exactly the limit's
   number of grid points (σ 1, q 0.01, 3,626,975 events: 4,194,304 points, 512 MiB at 128
   bytes), and ``compose_epsilon`` of the same ledger refused it after 30 s ("the composition
   with the 1 distinct events of the ledger would hold ~4.19e+06 grid points"): it counted
   the identity's one point and the PMF's points as a + b where composing them gives
   a + b - 1. A run at that edge would release its last round and then fail to account it.
   Now ``pld_epsilon`` counts a + b - 1: what the start accepts, every ε query accepts.
"""

from __future__ import annotations

import os
import resource

import pytest

from fedprivopt.privacy import pld_guard, prv_guard
from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent


def _child_peak_growth(ledger, delta) -> int:
    """Bytes the peak resident memory of a forked child grows by while it composes ``ledger``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read)
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            compose_epsilon(ledger, delta, accountant="prv")
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
            os.write(write, str(grown * 1024).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data
    return int(data)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_1_prv_guard_bounds_the_peak_resident_memory():
    ev = SubsampledGaussianEvent.poisson(sample_rate=0.25, noise_multiplier=0.5)
    ledger = [(ev, 250)]
    points = prv_guard.prv_domain_points(ledger, 1e-4)
    assert 1.4e6 < points < 1.7e6
    compose_epsilon([(ev, 2)], 1e-4, accountant="prv")  # Opacus and scipy loaded in the parent
    grown = _child_peak_growth(ledger, 1e-4)
    # before: 72 bytes a point (113 MB) for a growth of about 280 MB
    assert grown <= prv_guard._PRV_BYTES * points


def test_2_what_the_pld_check_accepts_every_query_accepts(monkeypatch):
    ev = SubsampledGaussianEvent.poisson(sample_rate=1.0, noise_multiplier=1.0)
    h, count = 1e-3, 3
    points = pld_guard._self_compose_points(ev, h, count)  # 61,477: what the composition holds
    monkeypatch.setattr(pld_guard, "PLD_MAX_BYTES", points * pld_guard._PLD_FFT_BYTES)
    pld_guard.check_pld_ledger([(ev, count)], h)  # accepted at a run's start
    eps = compose_epsilon([(ev, count)], 1e-5, accountant="pld", pld_discretization=h)
    assert 8.0 < eps < 9.0  # before: PLDGridTooLargeError (61,478 points counted)
    with pytest.raises(pld_guard.PLDGridTooLargeError):
        pld_guard.check_pld_ledger([(ev, count + 1)], h)
