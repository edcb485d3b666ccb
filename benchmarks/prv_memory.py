"""Peak resident memory of Opacus' PRV accountant per domain point, against the guard's estimate.

Usage: ``python benchmarks/prv_memory.py`` (about 30 s on 2 cores). A forked child composes a
ledger of about 1.6e6 domain points (the extra memory per point appears only above about 1.5e6)
and reports how much its peak resident memory (``ru_maxrss``) grew; the script prints the bytes
per point and ``prv_guard._PRV_BYTES``, the guard's estimate, and exits 1 if the estimate is below
the measurement (the guard would then let a domain above ``PRV_MAX_BYTES`` through). Recorded in
``NOTES.md``, entry 20; a memory goal, so a benchmark and not a unit test (the thirty-eighth
review of issue 15 measured 176-184 bytes against the 72 tracemalloc had given).
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedprivopt.privacy import prv_guard
from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent


def child_peak_growth(ledger, delta: float) -> int:
    """Bytes the peak resident memory of a forked child grows by while it composes ``ledger``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
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
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not data:
        raise RuntimeError("the measuring child failed")
    return int(data)


def main() -> int:
    event = SubsampledGaussianEvent.poisson(sample_rate=0.25, noise_multiplier=0.5)
    ledger, delta = [(event, 250)], 1e-4
    points = prv_guard.prv_domain_points(ledger, delta)
    compose_epsilon([(event, 2)], delta, accountant="prv")  # Opacus and scipy in the parent
    grown = child_peak_growth(ledger, delta)
    per_point = grown / points
    print(
        f"PRV domain of {points:,.0f} points: peak RSS grew {grown / 2**20:.0f} MiB, "
        f"{per_point:.0f} bytes a point; the guard counts {prv_guard._PRV_BYTES}"
    )
    return 0 if per_point <= prv_guard._PRV_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
