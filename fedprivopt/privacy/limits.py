"""Bounds shared by the accountant's saved state and the mechanisms that check against them.

A module of its own, without dp-accounting: the client side (``clients.trainer`` through
``privacy.adaptive_clip``) checks a noise multiplier against :data:`MAX_STATE_NOISE_MULTIPLIER`
and should not import dp-accounting and SciPy for it (about 1.1 s of CPU in every ClientApp
process and Ray actor, measured on the 2-core development machine).
"""

from __future__ import annotations

__all__ = ["MAX_STATE_NOISE_MULTIPLIER"]

#: Largest noise multiplier of an event in a saved state: far above any useful noise level (ε is
#: 0 to double precision long before), while ``σ²`` stays finite in float64 (σ = 1e308 made
#: ``epsilon`` raise ``OverflowError``). All three accountants were checked up to 1e150.
MAX_STATE_NOISE_MULTIPLIER = 1e100
