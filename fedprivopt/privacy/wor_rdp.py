"""dp-accounting's RDP bound of sampling without replacement, evaluated without cancellation.

Fixed-size sampling (a cohort of exactly ``m`` of ``N`` users, replace-one) is accounted by
dp-accounting with Theorem 27 of Wang, Balle & Kasiviswanathan (2019)
(``_compute_rdp_sample_wor_gaussian_int``). Its terms need the forward differences
``Δ^k G(0)`` of ``G(j) = exp(c (j - 1) j)``, ``c = 1/(2σ²)``; dp-accounting takes them by
differencing float64 values ``k`` times. At a small ``c`` (σ above a few) the true differences
are of order ``c^(k/2)`` while the values are about 1, so the computed ones are rounding noise of
order ``2^k · 1e-16``: always far above the truth in the cases checked (so still an upper bound),
but the bound then no longer falls with σ. Thirty-fourth review of issue 15: one round of a cohort
of 1 of 2 users had ε 0.12 to 0.15 at δ 1e-5 for every σ from 50 to 1e5 (where the whole
population as cohort, no sampling, needs σ 130 for ε 0.05), ε was jagged in σ (9 of 10 users,
10 rounds: 0.9985 at σ 40.825, 1.0032 at 40.815, 1.0023 at 40.84), and ``calibrate`` returned
σ 2e5 for a target that σ 130 meets.

:func:`wor_rdp_bound` evaluates the same bound, term for term, with the differences of ``G``
rounded to ``P`` bits as integers and differenced exactly: each rounded value is within 2 units
of ``2^P G(j)``, so ``|Δ^k G(0)| <= (|D_k| + 2^(k+1)) 2^-P`` for the exact integer difference
``D_k``, an upper bound whatever ``P`` is (``P`` only decides how tight). The terms are summed
in logs without cancellation, as :func:`~fedprivopt.privacy.rdp_curves._poisson_int_rdp` does
for Poisson sampling, and the result inflated by a relative ``1e-6`` for the float64 rounding
of the sum. The accountant takes the smaller of it and dp-accounting's value order by order:
where dp-accounting's differences are exact the latter is kept to the bit (so ledgers of
ordinary σ compose as before), and where they are rounding noise this is taken.

References
----------
Y.-X. Wang, B. Balle, S. Kasiviswanathan, "Subsampled Rényi Differential Privacy and Analytical
Moments Accountant", AISTATS 2019, Theorem 27.
"""

from __future__ import annotations

import decimal
import functools
import math

import numpy as np

__all__ = ["wor_rdp_bound"]

#: dp-accounting evaluates Theorem 27 term by term up to this order (Stirling's bound above,
#: whose terms have no differences and so no cancellation).
_MAX_EXACT_ORDER = 256
#: Largest ``c·n(n+1)`` (the log of the largest value of ``G``) evaluated here: beyond it the
#: values of ``G`` grow so fast that the last dominates each difference and dp-accounting's
#: float64 differences are accurate; orders above it keep dp-accounting's value.
_MAX_LOG_G = 700.0
_MAX_PRECISION_BITS = 8192
_MARGIN = 1e-6  # relative: covers float64's rounding in the logs and the sum of the terms


@functools.lru_cache(maxsize=256)
def _log_differences(c_float: float, n: int, precision: int) -> tuple[float, ...]:
    """Upper bounds on ``log |Δ^k G(0)|`` for ``k = 0 .. n``, ``G(j) = exp(c (j - 1) j)``.

    ``-inf`` where the bound is 0 (never: the rounding term is always positive).
    """
    top_bits = int(c_float * n * (n + 1) * 1.4427) + 2  # log2 of the largest G(j)
    digits = int((precision + top_bits + 40) * 0.30103) + 10
    with decimal.localcontext(decimal.Context(prec=digits, Emax=10**9, Emin=-(10**9))):
        c = decimal.Decimal(c_float)  # exact
        scale = decimal.Decimal(2) ** precision
        # Decimal's exp is correctly rounded: each value within 2 units of 2**P G(j)
        values = [int((c * ((j - 1) * j)).exp() * scale) for j in range(n + 1)]
    logs = []
    unit_log = -precision * math.log(2.0)
    row = values
    for k in range(n + 1):
        # row[0] is Δ^k G(0) times 2**P, to within 2**(k+1) (each value within 2 units)
        logs.append(math.log(abs(row[0]) + 2 ** (k + 1)) + unit_log)
        row = [row[i + 1] - row[i] for i in range(len(row) - 1)]
    return tuple(logs)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _log_a_int(q: float, sigma: float, alpha: int, deltas: tuple[float, ...]) -> float:
    """An upper bound on dp-accounting's ``log A_α`` of Theorem 27 at an integer ``alpha``.

    ``deltas[k]`` bounds ``log |Δ^k G(0)|`` from above; the terms are dp-accounting's.
    """
    c = 1.0 / (2.0 * sigma**2)
    log_q = math.log(q)
    f2 = 2.0 * c
    log_f2m1 = f2 + math.log(-math.expm1(-f2))
    logs = []
    for i in range(2, alpha + 1):
        if i == 2:
            s = 2 * log_q + _log_comb(alpha, 2) + min(math.log(4) + log_f2m1, f2 + math.log(2))
        else:
            lo, hi = deltas[2 * (i // 2)], deltas[2 * ((i + 1) // 2)]
            s = min(math.log(4) + 0.5 * (lo + hi), math.log(2) + c * (i - 1) * i)
            s += i * log_q + _log_comb(alpha, i)
        logs.append(s)
    peak = max(logs)
    log_sum = peak + math.log(sum(math.exp(v - peak) for v in logs))  # log(A_α - 1)
    # log(1 + e^log_sum), without cancellation on either side of 0
    if log_sum < 0:
        return math.log1p(math.exp(log_sum))
    return log_sum + math.log1p(math.exp(-log_sum))


def wor_rdp_bound(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """Theorem 27's RDP of a Gaussian of multiplier ``sigma`` sampled at ``q = m/N``, at ``orders``.

    An upper bound on what dp-accounting's ``_compute_rdp_sample_wor_gaussian`` computes in exact
    arithmetic, inflated by a relative 1e-6; ``inf`` at orders it does not evaluate (above 256,
    or where ``G`` grows too fast for cancellation to matter, or at ``q`` = 1, whose RDP
    dp-accounting gives in closed form).
    """
    out = np.full(len(orders), np.inf)
    if not 0.0 < q < 1.0:
        return out
    c = 1.0 / (2.0 * sigma**2)
    if not (math.isfinite(c) and c > 0.0):
        return out
    ints = [a for a in orders if a <= _MAX_EXACT_ORDER]
    top = max((math.ceil(a) for a in ints), default=0)
    while top >= 2 and c * (top + 2) * (top + 1) > _MAX_LOG_G:
        top -= 1
    if top < 2:
        return out
    # bits for the differences up to k = top + 1 (each amplifies rounding by 2**k), for the
    # terms' weights q**i C(α, i) <= 2**α, and for the smallest meaningful RDP (~ q² α² c)
    precision = int(2.0 * (top + 2) + 2.0 * math.log2(1.0 / q) + max(0.0, math.log2(1.0 / c)) + 96)
    deltas = _log_differences(c, top + 1, min(precision, _MAX_PRECISION_BITS))
    log_a = {1: 0.0}
    for i, alpha in enumerate(orders):
        lo, hi = math.floor(alpha), math.ceil(alpha)
        if hi > top or alpha > _MAX_EXACT_ORDER:
            continue
        for a in (lo, hi):
            if a not in log_a:
                log_a[a] = _log_a_int(q, sigma, a, deltas)
        t = alpha - lo
        value = ((1.0 - t) * log_a[lo] + t * log_a[hi]) / (alpha - 1.0)
        out[i] = math.nextafter(value * (1.0 + _MARGIN), math.inf)
    return out
