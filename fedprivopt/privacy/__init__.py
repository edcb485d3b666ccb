"""Privacy mechanics on flat tensors.

Flatten/unflatten (:mod:`.flat`), whole-update L2 clipping (:mod:`.clip`), Gaussian noise from
explicit generators (:mod:`.noise`, :mod:`.rng`), cohort samplers (:mod:`.sampling`), privacy
events (:mod:`.events`), the accountant facade over dp-accounting and Opacus (:mod:`.accounting`,
with its ledgers and saved states in :mod:`.accounting_state`, dp-accounting's guarded PLD in
:mod:`.pld_guard` and Opacus' guarded PRV accountant in :mod:`.prv_guard`) and noise calibration
(:mod:`.calibration`).
"""

import importlib

# Attributes are imported on first use (PEP 562): a client process needs clipping and noise, not
# the accountants, and dp-accounting/Opacus take seconds to import.
_LAZY = {
    "ACCOUNTANTS": "accounting_state",
    "PLDGridTooLargeError": "pld_guard",
    "PRVDomainTooLargeError": "prv_guard",
    "PrivacyAccountant": "accounting",
    "compose_epsilon": "accounting",
    "calibrate_noise_multiplier": "calibration",
    "make_round_event": "calibration",
    "ClipResult": "clip",
    "clip_l2": "clip",
    "l2_norm": "clip",
    "SAMPLING_KINDS": "events",
    "SubsampledGaussianEvent": "events",
    "FlatSpec": "flat",
    "flatten": "flat",
    "unflatten": "flat",
    "add_gaussian_noise": "noise",
    "gaussian_noise": "noise",
    "RngFactory": "rng",
    "derive_seed": "rng",
    "FixedSizeSampler": "sampling",
    "PoissonSampler": "sampling",
    "make_sampler": "sampling",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"fedprivopt.privacy.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedprivopt.privacy' has no attribute {name!r}")


__all__ = [
    "ACCOUNTANTS",
    "SAMPLING_KINDS",
    "ClipResult",
    "FixedSizeSampler",
    "FlatSpec",
    "PLDGridTooLargeError",
    "PRVDomainTooLargeError",
    "PoissonSampler",
    "PrivacyAccountant",
    "RngFactory",
    "SubsampledGaussianEvent",
    "add_gaussian_noise",
    "calibrate_noise_multiplier",
    "clip_l2",
    "compose_epsilon",
    "derive_seed",
    "flatten",
    "gaussian_noise",
    "l2_norm",
    "make_round_event",
    "make_sampler",
    "unflatten",
]
