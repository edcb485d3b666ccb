"""Privacy mechanics on flat tensors.

Flatten/unflatten (:mod:`.flat`), whole-update L2 clipping (:mod:`.clip`), Gaussian noise from
explicit generators (:mod:`.noise`, :mod:`.rng`), cohort samplers (:mod:`.sampling`), privacy
events (:mod:`.events`), the accountant facade over dp-accounting and Opacus (:mod:`.accounting`)
and noise calibration (:mod:`.calibration`).
"""

from fedprivopt.privacy.accounting import ACCOUNTANTS, PrivacyAccountant, compose_epsilon
from fedprivopt.privacy.calibration import calibrate_noise_multiplier, make_round_event
from fedprivopt.privacy.clip import ClipResult, clip_l2, l2_norm
from fedprivopt.privacy.events import SAMPLING_KINDS, SubsampledGaussianEvent
from fedprivopt.privacy.flat import FlatSpec, flatten, unflatten
from fedprivopt.privacy.noise import add_gaussian_noise, gaussian_noise
from fedprivopt.privacy.rng import RngFactory, derive_seed
from fedprivopt.privacy.sampling import FixedSizeSampler, PoissonSampler, make_sampler

__all__ = [
    "ACCOUNTANTS",
    "SAMPLING_KINDS",
    "ClipResult",
    "FixedSizeSampler",
    "FlatSpec",
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
