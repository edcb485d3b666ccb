"""How torch's OpenMP threads wait between parallel regions: passively, unless the user says.

torch's CPU wheels parallelize large operations with GNU OpenMP. By default an idle OpenMP thread
*spins* for a while before it sleeps, waiting for the next parallel region. On a machine whose
cores another process also wants, the spinning threads take the time slices that the working
thread of the same region needs, and a region cannot end before all of its threads have run: a
2-thread round of the fast engine then took 3-4x as long as a 1-thread one
(``benchmarks/NOTES.md``, entry 13). With ``OMP_WAIT_POLICY=PASSIVE`` a waiting thread sleeps at
once. How the work is split between the threads does not change, so results are the same to the
bit; what a quiet machine gives up is the wake-up of a sleeping thread (microseconds per region).

GNU OpenMP reads the variable once, when torch loads it, so :func:`passive_openmp_wait` must run
before ``import torch``: the command line (:func:`fedprivopt.cli.main`) and the benchmark harness
call it first. Nothing here imports torch.
"""

from __future__ import annotations

import os
import sys

__all__ = ["OMP_WAIT_POLICY", "passive_openmp_wait"]

OMP_WAIT_POLICY = "OMP_WAIT_POLICY"


def passive_openmp_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process and its children, unless already set.

    Only in a process that has not loaded torch yet (later, the variable would change nothing
    here, only the children's behaviour: the environment is then left alone). A value the user
    set (``ACTIVE`` included) is kept. Child processes (Ray workers, Flower's processes) inherit
    the environment, so they wait passively too.

    Returns
    -------
    bool
        Whether this process's OpenMP threads will wait passively: torch is not loaded yet and
        the variable is ``PASSIVE`` (set here or by the user).
    """
    if "torch" in sys.modules:
        return False
    os.environ.setdefault(OMP_WAIT_POLICY, "PASSIVE")
    return os.environ[OMP_WAIT_POLICY].strip().upper() == "PASSIVE"
