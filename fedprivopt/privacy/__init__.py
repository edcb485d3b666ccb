"""Privacy mechanics on flat tensors.

Flatten/unflatten (:mod:`.flat`), whole-update L2 clipping (:mod:`.clip`), Gaussian noise from
explicit generators (:mod:`.noise`, :mod:`.rng`), cohort samplers (:mod:`.sampling`), privacy
events (:mod:`.events`), the accountant facade over dp-accounting and Opacus (:mod:`.accounting`,
with its ledgers and saved states in :mod:`.accounting_state`, dp-accounting's guarded PLD in
:mod:`.pld_guard` and Opacus' guarded PRV accountant in :mod:`.prv_guard`) and noise calibration
(:mod:`.calibration`).
"""

from fedprivopt.core.lazy import lazy_package

# A client process needs clipping and noise, not the accountants; dp-accounting and Opacus take
# seconds to import.
__all__ = lazy_package(
    __name__,
    {
        "accounting_state": ("ACCOUNTANTS",),
        "pld_guard": ("PLDGridTooLargeError",),
        "prv_guard": ("PRVDomainTooLargeError",),
        "accounting": (
            "PrivacyAccountant",
            "compose_epsilon",
        ),
        "calibration": (
            "calibrate_noise_multiplier",
            "make_round_event",
        ),
        "clip": (
            "ClipResult",
            "clip_l2",
            "l2_norm",
        ),
        "events": (
            "SAMPLING_KINDS",
            "SubsampledGaussianEvent",
        ),
        "flat": (
            "FlatSpec",
            "flatten",
            "unflatten",
        ),
        "noise": (
            "add_gaussian_noise",
            "gaussian_noise",
        ),
        "rng": (
            "RngFactory",
            "derive_seed",
        ),
        "sampling": (
            "FixedSizeSampler",
            "PoissonSampler",
            "make_sampler",
        ),
    },
)
